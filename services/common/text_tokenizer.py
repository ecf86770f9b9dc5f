"""The tokenizer every service talks to, whatever file it was built from.

It wraps a `tokenizers.Tokenizer` (Rust, no transformers at run time) with the
few facts about the model that live outside the vocabulary: which ids start and
end a sequence, the chat template and how long a context the model was trained
for. Loading lives in `tokenizer_loader`, so this module stays free of file
formats.

Special tokens written in text are honoured in `encode`, the caller's own raw
prompt (as vLLM does for /v1/completions: the tenant writes its own context),
and never in chat message content (`render_chat`, `encode_chat`), which only
the chat template may turn into control tokens (see `chat_prompt`, which
counts added tokens shaped like markup, such as "<tool_call>", as special).

Encoding goes through the tokenizer's batch call even for one text: unlike
`Tokenizer.encode`, it releases the GIL, so the tokenizer service can encode
on worker threads while its event loop keeps serving.
"""

from dataclasses import dataclass, field
from functools import cached_property

from tokenizers import Tokenizer

from maas_services.common.chat_prompt import ChatPrompt, SpecialTokens, render_prompt
from maas_services.common.token_reach import max_token_chars


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
        single control id, as in Hugging Face. `add_special_tokens` adds only
        what the model's files ask for (a BOS for some models, nothing for
        SmolLM2); chat templates usually write those tokens themselves, hence
        the default.
        """
        encoded = self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return encoded[0].ids

    def render_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> ChatPrompt:
        """`messages` and `tools` in this model's chat template, special-token text made inert."""
        return render_prompt(
            self.chat_template,
            messages,
            add_generation_prompt,
            self.bos_token,
            self.eos_token,
            self.special_tokens,
            tools,
        )

    def encode_prompt(self, prompt: ChatPrompt) -> list[int]:
        """Token ids of a rendered chat: the template's special tokens, plain text between."""
        # No BOS/EOS of the post-processor's per piece: the template writes those
        # itself, as for Hugging Face's apply_chat_template.
        plain = self.plain_text_tokenizer.encode_batch_fast(
            list(prompt.plain), add_special_tokens=False
        )
        ids = list(plain[0].ids)
        for special, text in zip(prompt.special, plain[1:], strict=True):
            ids.append(self.special_tokens.ids[special])
            ids.extend(text.ids)
        return ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` rendered with this model's chat template, ready to answer."""
        return self.encode_prompt(self.render_chat(messages))

    @cached_property
    def special_tokens(self) -> SpecialTokens:
        return SpecialTokens.of(self.tokenizer)

    @cached_property
    def plain_text_tokenizer(self) -> Tokenizer:
        """The same vocabulary with control-token matching off: "<|im_end|>" is seven tokens."""
        # A copy, because encode_special_tokens is the tokenizer's state, shared by every thread.
        plain = Tokenizer.from_str(self.tokenizer.to_str())
        # encode_special_tokens leaves added tokens that are not special matched:
        # the ones chat_prompt counts as control ("<tool_call>") become special
        # here, in this copy only, so decoding still shows them.
        markup = [
            token
            for token in plain.get_added_tokens_decoder().values()
            if not token.special and token.content in self.special_tokens.ids
        ]
        for token in markup:
            token.special = True
        plain.add_special_tokens(markup)
        plain.encode_special_tokens = True
        return plain

    @cached_property
    def max_token_chars(self) -> int | None:
        """The most characters one token covers, if that is bounded (see token_reach)."""
        return max_token_chars(self.tokenizer)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry as stored (byte-level spelling, e.g. "Ġhello")."""
        return self.tokenizer.id_to_token(token_id)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)
