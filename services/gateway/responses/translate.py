"""A Responses request -> the chat request the pipeline already serves, and back.

/v1/responses is served by the chat pipeline (admission, limits, tokenizer,
tools, grammars, billing) unchanged: its input items become chat messages,
its function tools and tool_choice chat's, its `text.format` chat's
`response_format`, `max_output_tokens` chat's `max_tokens`. So a response
is admitted, limited, tokenized and billed exactly as a chat completion is.

Input items -> messages:
- a message item: a message of its role (its content parts' text joined);
- function_call items: the tool_calls of one assistant message (added to the
  assistant message just before them, as chat history holds them);
- a function_call_output item: a "tool" message answering its call_id.
`instructions` become a leading system message of this turn only (as OpenAI:
a previous response's instructions are not carried over). With
`previous_response_id`, the stored conversation (every message before, the
previous output included) comes first.
"""

import dataclasses

from maas_services.common.openai_api.errors import APIError, bad_request
from maas_services.common.openai_api.parsed_request import ParsedRequest, chat_request
from maas_services.common.openai_api.schemas import MAX_MESSAGES, ChatCompletionRequest, ChatMessage
from maas_services.common.openai_api.structured_output import JsonSchemaFormat, ResponseFormat
from maas_services.common.openai_api.tool_calls import (
    CalledFunction,
    Function,
    MessageToolCall,
    NamedFunction,
    NamedToolChoice,
    Tool,
)
from maas_services.gateway.responses.request import ResponsesRequest

# Chat's name for a field -> the Responses API's, in errors the client reads.
PARAMS = {"response_format": "text.format", "max_tokens": "max_output_tokens"}


@dataclasses.dataclass(frozen=True)
class Translated:
    parsed: ParsedRequest
    # The conversation before this turn's output, without instructions: what a
    # stored response keeps for the next turn (as schemas.ChatMessage dicts).
    conversation: list[dict]


def translate(
    body: ResponsesRequest,
    response_id: str,
    previous: list[dict] | None,
    session_header: str | None,
) -> Translated:
    """The ParsedRequest the pipeline admits; APIError 400 naming a Responses field."""
    history = [ChatMessage.model_validate(m) for m in previous or []]
    turn = input_messages(body.input)
    system = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    messages = system + history + turn
    if not messages:
        raise bad_request("input is empty: give at least one item", param="input")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(
            f"the conversation has {len(messages)} messages; at most {MAX_MESSAGES}",
            param="previous_response_id" if history else "input",
        )
    chat = ChatCompletionRequest(
        model=body.model,
        messages=messages,
        tools=chat_tools(body),
        tool_choice=chat_tool_choice(body),
        response_format=response_format(body),
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        user=body.user,
    )
    try:
        parsed = chat_request(chat, session_header)
    except APIError as exc:
        raise renamed(exc) from None
    parsed = dataclasses.replace(
        parsed,
        request_id=response_id,
        grammar_param=PARAMS.get(parsed.grammar_param, parsed.grammar_param),
    )
    conversation = [m.model_dump(exclude_none=True) for m in history + turn]
    return Translated(parsed, conversation)


def renamed(error: APIError) -> APIError:
    """The error with chat's field names turned into the Responses API's."""
    for chat_name, name in PARAMS.items():
        error.message = error.message.replace(chat_name, name)
        if error.param == chat_name:
            error.param = name
    return error


def input_messages(items) -> list[ChatMessage]:
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    messages: list[ChatMessage] = []
    for item in items:
        if item.type == "message":
            messages.append(ChatMessage(role=item.role, content=item.text()))
        elif item.type == "function_call_output":
            messages.append(
                ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id)
            )
        else:
            call = MessageToolCall(
                id=item.call_id,
                function=CalledFunction(name=item.name, arguments=item.arguments),
            )
            last = messages[-1] if messages else None
            if last is None or last.role != "assistant":
                last = ChatMessage(role="assistant", content=None)
                messages.append(last)
            last.tool_calls = [*(last.tool_calls or []), call]
    return messages


def chat_tools(body: ResponsesRequest) -> list[Tool] | None:
    if not body.tools:
        return None
    return [
        Tool(
            type="function",
            function=Function(name=t.name, description=t.description, parameters=t.parameters),
        )
        for t in body.tools
    ]


def chat_tool_choice(body: ResponsesRequest):
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))


def response_format(body: ResponsesRequest) -> ResponseFormat | None:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    return ResponseFormat(
        type="json_schema",
        json_schema=JsonSchemaFormat(
            name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=fmt.strict
        ),
    )


def assistant_message(text: str, calls: list[dict]) -> dict:
    """This turn's output as the chat message a next turn reads (ChatMessage's dict)."""
    message = ChatMessage(
        role="assistant",
        content=text or None,
        tool_calls=[
            MessageToolCall(
                id=call["call_id"],
                function=CalledFunction(name=call["name"], arguments=call["arguments"]),
            )
            for call in calls
        ]
        or None,
    )
    return message.model_dump(exclude_none=True)
