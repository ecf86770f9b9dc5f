"""The tokenizer every service talks to, whatever file it was built from.

It wraps a `tokenizers.Tokenizer` (Rust, no transformers at run time) with the
few facts about the model that live outside the vocabulary: which ids start and
end a sequence, the chat template and how long a context the model was trained
for. Loading lives in `tokenizer_loader`, so this module stays free of file
formats.
"""

from dataclasses import dataclass, field

from tokenizers import Tokenizer

from services.common.chat_template import render_chat


@dataclass(frozen=True)
class TextTokenizer:
    # Its repr is the whole vocabulary.
    tokenizer: Tokenizer = field(repr=False)
    bos_token_id: int | None
    eos_token_id: int | None
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None
    # None when the files do not say; callers then need an explicit limit.
    max_model_len: int | None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids for `text`.

        Special tokens written in the text, such as "<|im_start|>", become their
        single control id, as in Hugging Face: a rendered chat prompt depends on
        it. `add_special_tokens` adds only what the model's files ask for
        (a BOS for some models, nothing for SmolLM2); chat templates usually
        write those tokens themselves, hence the default.
        """
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` rendered with this model's chat template, ready to answer."""
        return self.encode(
            render_chat(self.chat_template, messages, True, self.bos_token, self.eos_token)
        )

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry as stored (byte-level spelling, e.g. "Ġhello")."""
        return self.tokenizer.id_to_token(token_id)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)
