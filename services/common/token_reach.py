"""The most characters one token can stand for, so a prompt can be refused unread.

Encoding megabytes costs seconds of CPU, and most of that work is wasted on a
prompt that cannot fit anyway. If no token covers more than L characters, a
text of C characters needs at least ceil(C / L) tokens: a prompt whose
character count alone exceeds the context is refused before it is encoded.

The bound is only sound when every character of the text reaches the model:
byte-level BPE with no normalizer (a GGUF vocabulary, or Llama 3 and SmolLM2's
tokenizer.json) spells each token as the bytes it covers, so a token of L
characters covers at most L bytes, and so at most L characters. A normalizer
(NFC merges characters), a pre-tokenizer that removes text, or an added token
that swallows the whitespace beside it (lstrip/rstrip) breaks that, and then
there is no bound: the prompt is encoded and counted.
"""

import json

from tokenizers import Tokenizer

# Pre-tokenizers that split text without dropping any of it, unless told to.
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Digits", "Split", "Punctuation"})


def max_token_chars(tokenizer: Tokenizer) -> int | None:
    """L, the longest token's length in characters, or None where no such bound holds."""
    config = json.loads(tokenizer.to_str())
    if config.get("normalizer") is not None or config["model"].get("type") != "BPE":
        return None
    if not _byte_level(config.get("pre_tokenizer")):
        return None
    if any(t.get("lstrip") or t.get("rstrip") for t in config.get("added_tokens", [])):
        return None
    return max(map(len, tokenizer.get_vocab(with_added_tokens=True)))


def _byte_level(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer])
    return any(step["type"] == "ByteLevel" for step in steps) and all(
        step["type"] in _KEEPING_PRE_TOKENIZERS and step.get("behavior") != "Removed"
        for step in steps
    )
