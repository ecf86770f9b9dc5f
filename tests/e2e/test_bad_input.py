"""Every kind of bad input gets an OpenAI error object and breaks nothing."""

import httpx
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def http(stack) -> httpx.Client:
    with httpx.Client(
        base_url=stack.gateway_url,
        headers={"Authorization": f"Bearer {stack.api_key}"},
        timeout=60,
    ) as client:
        yield client


def chat(**overrides) -> dict:
    body = {
        "model": DEFAULT_MODEL_ID,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    }
    body.update(overrides)
    return body


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_malformed_json_is_400(http):
    response = http.post(
        "/v1/chat/completions", content=b'{"model": ', headers={"Content-Type": "application/json"}
    )
    error = error_of(response, 400)
    assert "JSON" in error["message"]


def test_unknown_model_is_404_model_not_found(http):
    error = error_of(http.post("/v1/chat/completions", json=chat(model="gpt-17")), 404)
    assert error["code"] == "model_not_found"
    assert "gpt-17" in error["message"]


def test_missing_key_is_401(stack):
    response = httpx.post(f"{stack.gateway_url}/v1/chat/completions", json=chat())
    assert error_of(response, 401)["code"] == "invalid_api_key"


def test_wrong_key_is_401(stack):
    response = httpx.post(
        f"{stack.gateway_url}/v1/chat/completions",
        json=chat(),
        headers={"Authorization": "Bearer sk-maas-not-a-real-key"},
    )
    assert error_of(response, 401)["code"] == "invalid_api_key"


def test_models_needs_a_key(stack):
    assert httpx.get(f"{stack.gateway_url}/v1/models").status_code == 401


def test_prompt_beyond_context_is_400_naming_both_numbers(http):
    long_text = "hello " * 9000
    response = http.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": long_text}])
    )
    error = error_of(response, 400)
    assert "8192" in error["message"]
    prompt_tokens = int(error["message"].split("(")[1].split(" ")[0])
    assert prompt_tokens > 8192


def test_prompt_plus_max_tokens_beyond_context_is_400(http):
    response = http.post(
        "/v1/completions",
        json={"model": DEFAULT_MODEL_ID, "prompt": "hello " * 8000, "max_tokens": 1000},
    )
    error = error_of(response, 400)
    assert "8192" in error["message"] and "1000" in error["message"]


def test_token_id_prompt_out_of_vocab_is_400(http):
    response = http.post(
        "/v1/completions",
        json={"model": DEFAULT_MODEL_ID, "prompt": [1, 2, 10**7], "max_tokens": 2},
    )
    assert "token ids" in error_of(response, 400)["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("top_p", 0),
        ("top_p", 1.5),
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("presence_penalty", 3),
        ("n", 17),
        ("top_logprobs", 30),
    ],
)
def test_invalid_sampling_is_400_naming_the_field(http, field, value):
    error = error_of(http.post("/v1/chat/completions", json=chat(**{field: value})), 400)
    assert error["param"] == field
    assert field in error["message"]


def test_bad_role_is_400(http):
    response = http.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "wizard", "content": "hi"}])
    )
    assert error_of(response, 400)["param"].startswith("messages")


def test_empty_messages_is_400(http):
    assert error_of(http.post("/v1/chat/completions", json=chat(messages=[])), 400)["param"] == (
        "messages"
    )


def test_service_still_answers_after_bad_input(http):
    response = http.post("/v1/chat/completions", json=chat(temperature=0))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] > 0


def raw(http, body: bytes, content_type: str = "application/json", path="/v1/chat/completions"):
    return http.post(path, content=body, headers={"Content-Type": content_type})


MALFORMED = [
    (b"\xff\xfe\x00not utf-8", "application/json"),
    (b'{"model": "\xe9t\xe9"}', "application/json"),
    (b'{"model": "m"}', "text/plain"),
    (b'{"model": "m"}', "application/x-www-form-urlencoded"),
    (b"", "application/json"),
    (b"[]", "application/json"),
    (b'"a string"', "application/json"),
    (b"null", "application/json"),
    (b"[" * 100_000, "application/json"),
    (b'{"max_tokens": ' + b"9" * 5000 + b"}", "application/json"),
    (b'{"model": "m", "messages": "hi"}', "application/json"),
    (b'{"model": "m", "messages": [{"role": "user", "content": {"a": 1}}]}', "application/json"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}', "application/json"),
    (b'{"model": "m", "messages": [{"role": "user"}], "temperature": NaN}', "application/json"),
    (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}',
        "application/json",
    ),
    (b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', "application/json"),
    (b'{"model": "", "messages": [{"role": "user", "content": "x"}]}', "application/json"),
]
FIELDS = [
    {"max_tokens": 10**20},
    {"max_tokens": "ten"},
    {"seed": -1},
    {"stop": [1, 2]},
    {"stop": ["x"] * 17},
    {"n": 1.5},
    {"top_k": 10**12},
    {"stream_options": "yes"},
    {"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]},
]
PROMPTS = [[1, -5], [1, 2**40], [[1, 2]], {"a": 1}, [], "", ["a", "b"]]


def test_a_batch_of_malformed_requests_gets_only_4xx_openai_errors(http):
    answers = [raw(http, body, ctype) for body, ctype in MALFORMED]
    answers += [http.post("/v1/chat/completions", json=chat(**fields)) for fields in FIELDS]
    answers += [
        http.post("/v1/completions", json={"model": DEFAULT_MODEL_ID, "prompt": p, "max_tokens": 2})
        for p in PROMPTS
    ]
    answers += [http.get("/v1/nothing-here"), http.delete("/v1/models")]
    for answer in answers:
        assert 400 <= answer.status_code < 500, (answer.request.content[:80], answer.text)
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def test_oversized_body_is_413_and_wrong_content_type_is_415(http):
    big = chat(messages=[{"role": "user", "content": "x" * (4 * 1024 * 1024)}])
    error = error_of(http.post("/v1/chat/completions", json=big), 413)
    assert error["code"] == "request_too_large"
    error = error_of(raw(http, b'{"model": "m"}', "text/plain"), 415)
    assert "application/json" in error["message"]


def test_non_utf8_is_400(http):
    assert error_of(raw(http, b'{"model": "\xff"}'), 400)["code"] == "invalid_encoding"


def test_unknown_fields_are_ignored(http):
    response = http.post(
        "/v1/chat/completions",
        json=chat(temperature=0, logit_bias={"1": 5}, some_future_field={"x": [1]}),
    )
    assert response.status_code == 200, response.text
