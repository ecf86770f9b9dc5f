"""Refuse to serve a vLLM model whose tokenizer is not the tokenizer service's.

The gateway sends token ids the tokenizer service encoded, the router hashes
them, billing counts them: a vLLM model with another vocabulary would still
answer, just about other tokens. vLLM's /tokenize of a few probe texts, which
cover byte-level fallbacks, special tokens and whitespace runs, must equal ours.
"""

import httpx

from maas_services.common.text_tokenizer import TextTokenizer

PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "naïve café, 日本語のテキスト, emoji 🙂🚀 and ∑ maths",
    "def f(x):\n\treturn x ** 2  # comment\n\n\n",
    "1234567890 3.14159 -42 0x1F",
)


async def tokenizer_mismatch(
    client: httpx.AsyncClient, served_model: str, tokenizer: TextTokenizer
) -> str | None:
    """None when vLLM encodes every probe as we do, else what differed."""
    # Sorted: the vocabulary's special tokens, in one stable probe.
    specials = "".join(sorted(tokenizer.special_tokens.ids))
    for text in (*PROBES, f"{specials} hello{specials}"):
        response = await client.post(
            "/tokenize",
            json={"model": served_model, "prompt": text, "add_special_tokens": False},
        )
        response.raise_for_status()
        theirs = response.json()["tokens"]
        ours = tokenizer.encode(text)
        if theirs != ours:
            return f"{text!r}: vLLM encodes {theirs[:12]}..., ours {ours[:12]}..."
    return None
