"""The engine's own tokenizer (the GGUF vocabulary) as xgrammar sees it.

Built once per process: a grammar compiled against another vocabulary would
mask the wrong ids. xgrammar's Hugging Face reader decodes the vocabulary
(byte-level, byte-fallback or raw, whichever the tokenizer is), but it counts
as special only tokens that decode to nothing, and ours decode to their
text; so special tokens get an empty spelling here, which keeps a grammar
from letting "<|im_start|>" into a JSON string.

The engine and the tokenizer service's check (services/tokenizer/grammar_check.py)
both build it here, from the tokenizer alone, so a grammar the check accepts
is the one the engine compiles: the stop token is the tokenizer's end of
sequence (the engine ends a constrained output when its grammar terminates,
whatever other ids also end a turn), and the vocabulary is as wide as the
tokenizer's, or the model's logits where the engine says they are wider (ids
past the tokenizer's are never allowed).
"""

import xgrammar
from transformers import PreTrainedTokenizerFast

from maas_services.common.text_tokenizer import TextTokenizer


def tokenizer_info(tokenizer: TextTokenizer, logits_width: int = 0) -> xgrammar.TokenizerInfo:
    """logits_width: the model's vocabulary size, where the engine knows it."""
    vocab_size = max(tokenizer.vocab_size, logits_width)
    eos = tokenizer.eos_token_id
    stop_token_ids = [] if eos is None else [eos]
    hf = tokenizer.tokenizer
    decoded = xgrammar.TokenizerInfo.from_huggingface(
        PreTrainedTokenizerFast(tokenizer_object=hf),
        vocab_size=vocab_size,
        stop_token_ids=stop_token_ids,
    ).decoded_vocab
    special = {i for i, token in hf.get_added_tokens_decoder().items() if token.special}
    return xgrammar.TokenizerInfo(
        [b"" if i in special else text for i, text in enumerate(decoded)],
        xgrammar.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=stop_token_ids,
    )
