"""Turn generated token ids into text one token at a time, for streaming.

Byte-level tokens are bytes, not characters: an emoji is often two or three
tokens, and decoding after the first gives U+FFFD. Decoding the whole output
again after every token would be right but quadratic, so, as vLLM does, we only
decode a short window: the tokens since the last complete character, preceded
by the tokens of the text emitted just before them. That preceding text gives
decoders that treat the start of a string specially (sentencepiece drops a
leading space there) the same context as a full decode, and its length tells
where the new text begins.
"""

from maas_services.common.text_tokenizer import TextTokenizer

REPLACEMENT_CHAR = "\ufffd"

# Prompt tokens kept as context for the first generated tokens; a few are enough
# for any decoder that only looks at the start of the string.
_PROMPT_CONTEXT = 5


class IncrementalDetokenizer:
    """Deltas of text whose concatenation equals `tokenizer.decode(output_ids)`.

    A token whose text ends in U+FFFD is held back until a later token completes
    the character (or `flush` gives up at the end), so no delta ever carries a
    replacement character that the full decode would not. Byte-level BPE, as
    SmolLM2 uses, decodes the same with or without `prompt_ids`; they only
    matter for decoders that look at the start of the string.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        prompt_ids: list[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # The window: _ids[:_read] is already emitted (or prompt) and decodes to
        # _emitted_len characters; _ids[_read:] is held back.
        self._ids = list(prompt_ids[-_PROMPT_CONTEXT:]) if prompt_ids else []
        context = self._decode(self._ids)
        # A prompt cut mid-character would make the first output character start
        # inside the context; decode(output_ids) has no context either, so drop it.
        if context.endswith(REPLACEMENT_CHAR):
            self._ids, context = [], ""
        self._read = len(self._ids)
        self._emitted_len = len(context)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it completes, possibly ""."""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        # No new text (a skipped special token) keeps the window, so its context survives.
        if text.endswith(REPLACEMENT_CHAR) or len(text) <= self._emitted_len:
            return ""
        return self._emit(text)

    def flush(self) -> str:
        """Emit whatever is held back, replacement characters included; call once at the end."""
        return self._emit(self._decode(self._ids))

    def _emit(self, text: str) -> str:
        delta = text[self._emitted_len :]
        # Slide the window: the tokens just emitted become the context for the next ones.
        self._ids = self._ids[self._read :]
        self._read = len(self._ids)
        self._emitted_len = len(self._decode(self._ids))
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
