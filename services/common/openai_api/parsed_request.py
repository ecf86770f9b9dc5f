"""A completion request as the pipeline takes it, whichever front it came in by.

Both fronts validate with the same pydantic models (schemas.py) and turn the
result into a ParsedRequest here, so the session rule and the sampling
defaults are written once. The sampling proto built here is the one the
engine receives; the pipeline only fills in max_tokens when the client left
it unset, because that default needs the prompt's length.
"""

import uuid
from dataclasses import dataclass

from maas.v1 import engine_pb2, tokenizer_pb2
from maas_services.common.openai_api.sampling import to_engine_sampling
from maas_services.common.openai_api.schemas import ChatCompletionRequest, CompletionRequest
from maas_services.common.openai_api.structured_output import grammar_of
from maas_services.common.openai_api.tool_calls import mode, prompt_messages, tools_text


@dataclass(frozen=True)
class ChatPrompt:
    messages: list[tokenizer_pb2.ChatMessage]
    # The tools offered, as JSON text (tool_calls.tools_text); "" for none.
    tools: str = ""


@dataclass(frozen=True)
class TextPrompt:
    """A string, or token ids the tokenizer only checks."""

    text: str | list[int]


@dataclass(frozen=True)
class ParsedRequest:
    request_id: str
    model: str
    prompt: ChatPrompt | TextPrompt
    sampling: engine_pb2.SamplingParams
    session_id: str = ""
    # The field sampling.grammar came from, named in the tokenizer's refusal.
    grammar_param: str = ""
    # "", "auto" or "forced": how the answer is read for tool calls (tool_calls.py).
    tool_mode: str = ""

    @property
    def n(self) -> int:
        return self.sampling.n

    @property
    def max_tokens(self) -> int | None:
        """The client's max_tokens; None when it left the choice to us."""
        return self.sampling.max_tokens or None


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _session(session_header: str | None, user: str | None) -> str:
    # Affinity key: the explicit header wins over OpenAI's `user`.
    return session_header or user or ""


def chat_request(body: ChatCompletionRequest, session_header: str | None) -> ParsedRequest:
    prompt = ChatPrompt(prompt_messages(body.messages), tools_text(body.tools, body.tool_choice))
    tool_mode = mode(body.tools, body.tool_choice)
    return _parsed("chatcmpl", body, prompt, session_header, tool_mode)


def text_request(body: CompletionRequest, session_header: str | None) -> ParsedRequest:
    prompt = body.prompt
    if isinstance(prompt, list) and isinstance(prompt[0], str):
        prompt = prompt[0]  # the schema allows one string in a list
    return _parsed("cmpl", body, TextPrompt(prompt), session_header)


def _parsed(
    prefix: str,
    body: ChatCompletionRequest | CompletionRequest,
    prompt: ChatPrompt | TextPrompt,
    session_header: str | None,
    tool_mode: str = "",
) -> ParsedRequest:
    # Once per request: the grammar's schema text is built (and size-checked) here only.
    found = grammar_of(body)
    sampling = to_engine_sampling(body)
    if found is not None:
        sampling.grammar.CopyFrom(found[0])
    return ParsedRequest(
        request_id=new_request_id(prefix),
        model=body.model,
        prompt=prompt,
        sampling=sampling,
        session_id=_session(session_header, body.user),
        grammar_param=found[1] if found else "",
        tool_mode=tool_mode,
    )
