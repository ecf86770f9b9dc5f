"""The engine's own tokenizer (the GGUF vocabulary) as xgrammar sees it.

Built once per process: a grammar compiled against another vocabulary would
mask the wrong ids. xgrammar's Hugging Face reader decodes the vocabulary
(byte-level, byte-fallback or raw, whichever the tokenizer is), but it counts
as special only tokens that decode to nothing, and ours decode to their
text; so special tokens get an empty spelling here, which keeps a grammar
from letting "<|im_start|>" into a JSON string. The end-of-sequence ids stay
the grammar's stop tokens.
"""

from collections.abc import Sequence

import xgrammar
from transformers import PreTrainedTokenizerFast

from services.common.text_tokenizer import TextTokenizer


def tokenizer_info(
    tokenizer: TextTokenizer, vocab_size: int, stop_token_ids: Sequence[int]
) -> xgrammar.TokenizerInfo:
    """vocab_size is the model's (its logits' width), which may exceed the tokenizer's."""
    hf = tokenizer.tokenizer
    decoded = xgrammar.TokenizerInfo.from_huggingface(
        PreTrainedTokenizerFast(tokenizer_object=hf),
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
    ).decoded_vocab
    special = {i for i, token in hf.get_added_tokens_decoder().items() if token.special}
    return xgrammar.TokenizerInfo(
        [b"" if i in special else text for i, text in enumerate(decoded)],
        xgrammar.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
    )
