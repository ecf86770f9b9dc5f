"""Structured outputs through the whole stack, with the official openai SDK."""

import openai
import pytest
from pydantic import BaseModel, Field

from services.common.model_files import DEFAULT_MODEL_ID

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key, max_retries=0)


def test_parse_returns_the_pydantic_object(client):
    reply = client.chat.completions.parse(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": "Name a city and its country, as JSON."}],
        response_format=City,
        temperature=0,
        max_tokens=48,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)


def test_an_invalid_schema_is_a_400_from_the_tokenizer_before_the_engine(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=DEFAULT_MODEL_ID,
            messages=[{"role": "user", "content": "hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "nope"}},
            },
        )
    error = caught.value.body
    assert error["param"] == "response_format"
    # The tokenizer's wording; the engine's would start "grammar: ".
    assert error["message"].startswith('invalid json_schema: Unsupported type "nope"')
