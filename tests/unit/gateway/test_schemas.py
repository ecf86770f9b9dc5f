import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from maas_services.common.openai_api.sampling import to_engine_sampling
from maas_services.common.openai_api.schemas import ChatCompletionRequest, CompletionRequest
from maas_services.gateway.http_api.http_app import validation_error


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def param_of(exc: ValidationError) -> str | None:
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
    return validation_error(RequestValidationError(errors)).param


def test_text_parts_join_into_one_string():
    body = ChatCompletionRequest(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    )
    assert body.messages[0].text() == "ab"


def test_max_completion_tokens_overrides_max_tokens():
    assert chat(max_tokens=5, max_completion_tokens=9).max_tokens == 9


def test_defaults_follow_openai_not_greedy():
    params = to_engine_sampling(chat())
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.top_k == 0
    assert not params.HasField("seed")


def test_vllm_extras_reach_the_engine():
    params = to_engine_sampling(
        chat(
            top_k=5,
            min_p=0.1,
            repetition_penalty=1.2,
            min_tokens=3,
            ignore_eos=True,
            seed=7,
            stop="x",
        )
    )
    assert (params.top_k, params.min_tokens, params.ignore_eos, params.seed) == (5, 3, True, 7)
    assert list(params.stop) == ["x"]
    assert params.min_p == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": 3}, "stop"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"n": 17}, "n"),
    ],
)
def test_validation_errors_name_the_field(fields, param):
    with pytest.raises(ValidationError) as caught:
        chat(**fields)
    assert param_of(caught.value) == param


def test_completion_prompt_forms():
    assert CompletionRequest(model="m", prompt=["one"]).prompt == ["one"]
    assert CompletionRequest(model="m", prompt=[1, 2, 3]).prompt == [1, 2, 3]
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt=["a", "b"])
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt=[])


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("make", "param"),
    [
        (lambda: chat(stop=["s" * 257]), "stop"),
        (lambda: chat(stop="s" * 257), "stop"),
        (
            lambda: ChatCompletionRequest(model="m", messages=[USER] * 2049),
            "messages",
        ),
        (
            lambda: ChatCompletionRequest(
                model="m",
                messages=[{"role": "user", "content": [{"type": "text", "text": "a"}] * 257}],
            ),
            "messages.0.content",
        ),
        (lambda: CompletionRequest(model="m", prompt=[1] * 131_073), "prompt"),
        (lambda: CompletionRequest(model="m" * 257, prompt="hi"), "model"),
    ],
)
def test_every_list_and_string_a_client_controls_is_bounded(make, param):
    with pytest.raises(ValidationError) as caught:
        make()
    assert param_of(caught.value) == param


def test_a_long_list_of_bad_items_costs_one_error_per_union_member():
    with pytest.raises(ValidationError) as caught:
        CompletionRequest(model="m", prompt=[[]] * 100_000)
    assert caught.value.error_count() <= 3
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest(model="m", messages=[{}] * 2000)
    assert caught.value.error_count() == 1
