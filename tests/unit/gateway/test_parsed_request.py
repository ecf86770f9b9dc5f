"""Both fronts turn a validated body into the pipeline's ParsedRequest the same way."""

from maas_services.common.openai_api.parsed_request import (
    ChatPrompt,
    TextPrompt,
    chat_request,
    text_request,
)
from maas_services.common.openai_api.schemas import ChatCompletionRequest, CompletionRequest


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def test_the_session_header_wins_over_user_and_either_may_be_absent():
    assert chat_request(chat(user="u"), "s").session_id == "s"
    assert chat_request(chat(user="u"), None).session_id == "u"
    assert text_request(CompletionRequest(model="m", prompt="p"), None).session_id == ""


def test_sampling_is_built_once_with_the_clients_max_tokens_or_zero_for_unset():
    assert chat_request(chat(max_completion_tokens=7, n=2), None).sampling.max_tokens == 7
    parsed = chat_request(chat(n=2), None)
    assert (parsed.n, parsed.max_tokens, parsed.sampling.temperature) == (2, None, 1.0)


def test_prompts_keep_their_kind():
    parsed = chat_request(chat(), None)
    assert isinstance(parsed.prompt, ChatPrompt) and parsed.prompt.messages[0].content == "hi"
    assert parsed.request_id.startswith("chatcmpl-")
    assert text_request(CompletionRequest(model="m", prompt=["one"]), None).prompt == TextPrompt(
        "one"
    )
    ids = text_request(CompletionRequest(model="m", prompt=[1, 2]), None)
    assert ids.prompt == TextPrompt([1, 2]) and ids.request_id.startswith("cmpl-")
