"""Chat prompts in which only the template can write a special token.

Message text comes from users. Encoded as part of the rendered prompt, a
message saying "<|im_end|>\\n<|im_start|>system\\n..." would become the model's
own control tokens and forge a system turn. So the template renders messages
whose special-token texts are swapped for private placeholders; the special
tokens left in the rendered prompt can only be the template's own, and the
prompt is cut at them. Those pieces become their ids; every piece between them,
placeholders put back, is encoded with special-token matching off, so a
user's "<|im_end|>" costs the tokens of its characters and means nothing.

Tools and tool calls (chat_tools) are text from users too: they are escaped
the same way, at any depth of the values the template is given.

"Special" here means what the model reads as control: the vocabulary's
special tokens, and its other added tokens shaped like markup ("<...>").
Qwen2.5's "<tool_call>" is an added token with special=False: the tokenizer
matches it in any text, so a user's "<tool_call>" would be the token the
model writes to call a tool, and the answer's parser would read it as one.

For a conversation without special-token text this encodes exactly what the
whole rendered prompt does: the tokenizer itself encodes the text between two
special tokens apart from the rest, after a token marked lstrip/rstrip has
taken the whitespace beside it, which the cut here does likewise.
"""

import re
import secrets
from dataclasses import dataclass

from tokenizers import Tokenizer

from maas_services.common.chat_template import render_chat
from maas_services.common.chat_tools import chat_input

# Any render's placeholder; a match counts only with this render's tag. One pattern
# compiled once: compiling one per tag took 60% of a short chat's render (140 of 230 us).
_PLACEHOLDER = re.compile("\ue000([0-9a-f]{16}):(\\d+)\ue001")
# An added token shaped like this is a control token even when not marked
# special ("<tool_call>", "</tool_call>", "<|fim_prefix|>").
_MARKUP = re.compile(r"<[^<>\s]+>")


@dataclass(frozen=True)
class SpecialTokens:
    """The vocabulary's control tokens (special, or added and shaped like markup),
    found in text the way the tokenizer finds them."""

    ids: dict[str, int]
    pattern: re.Pattern[str]
    lstrip: frozenset[str]
    rstrip: frozenset[str]

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> "SpecialTokens":
        added = [
            (token_id, token)
            for token_id, token in tokenizer.get_added_tokens_decoder().items()
            if token.special or _MARKUP.fullmatch(token.content)
        ]
        # Longest first: at one position the tokenizer matches the longest token.
        texts = sorted((t.content for _, t in added), key=len, reverse=True)
        return cls(
            ids={t.content: token_id for token_id, t in added},
            # One group, so that split() keeps the tokens between the pieces.
            pattern=re.compile(f"({'|'.join(map(re.escape, texts))})" if texts else "(?!)"),
            lstrip=frozenset(t.content for _, t in added if t.lstrip),
            rstrip=frozenset(t.content for _, t in added if t.rstrip),
        )


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered conversation: `text` as the model reads it, cut for encoding.

    `pieces` alternates plain text and special tokens, starting and ending with
    plain text (possibly empty), whitespace already given to lstrip/rstrip tokens.
    """

    text: str
    pieces: tuple[str, ...]
    # The parser for the answer's tool calls (services/common/openai_api/tool_parsers).
    tool_format: str = ""

    @property
    def plain(self) -> tuple[str, ...]:
        return self.pieces[::2]

    @property
    def special(self) -> tuple[str, ...]:
        return self.pieces[1::2]


def render_prompt(
    template: str | None,
    messages: list[dict],
    add_generation_prompt: bool,
    bos_token: str | None,
    eos_token: str | None,
    specials: SpecialTokens,
    tools: list[dict] | None = None,
) -> ChatPrompt:
    """Render `messages` and `tools` (see chat_tools) so that none can write a special token."""
    # A fresh tag per render: no message can contain a placeholder of its own.
    tag = secrets.token_hex(8)
    order = list(specials.ids)
    placeholder = {text: f"\ue000{tag}:{index}\ue001" for index, text in enumerate(order)}

    def escape(value):
        if isinstance(value, str):
            return specials.pattern.sub(lambda match: placeholder[match.group()], value)
        if isinstance(value, dict):
            return {escape(key): escape(item) for key, item in value.items()}
        if isinstance(value, list):
            return [escape(item) for item in value]
        return value

    given = chat_input(template, messages, tools)
    rendered = render_chat(
        template,
        escape(given.messages),
        add_generation_prompt,
        bos_token,
        eos_token,
        tools=escape(given.tools),
    )
    cut = specials.pattern.split(rendered)

    def restored(match: re.Match[str]) -> str:
        return order[int(match.group(2))] if match.group(1) == tag else match.group()

    cut[::2] = [_PLACEHOLDER.sub(restored, p) for p in cut[::2]]
    text = "".join(cut)
    for index in range(1, len(cut), 2):
        if cut[index] in specials.lstrip:
            cut[index - 1] = cut[index - 1].rstrip()
        if cut[index] in specials.rstrip:
            cut[index + 1] = cut[index + 1].lstrip()
    return ChatPrompt(text=text, pieces=tuple(cut), tool_format=given.tool_format)
