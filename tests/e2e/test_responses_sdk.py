"""/v1/responses through the whole stack, with the official openai SDK."""

import asyncio
import json

import jsonschema
import openai
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from tests.e2e.tenants import new_tenant_key

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "country"],
}


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key, max_retries=0)


@pytest.fixture(scope="module")
def other_client(stack) -> openai.OpenAI:
    _, key = asyncio.run(new_tenant_key(stack.redis_url, "resp"))
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=key, max_retries=0)


def greedy(client: openai.OpenAI, **kwargs):
    """A greedy response, asked twice so both come from the prefix cache
    (test_openai_sdk.from_cache says why)."""
    kwargs = {"model": DEFAULT_MODEL_ID, "temperature": 0, "max_output_tokens": 24, **kwargs}
    client.responses.create(**kwargs)
    return client.responses.create(**kwargs)


def test_a_plain_response_knows_the_capital_of_france(client):
    reply = client.responses.create(
        model=DEFAULT_MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=32
    )
    assert "Paris" in reply.output_text
    assert reply.id.startswith("resp_")
    assert reply.status in ("completed", "incomplete")
    assert reply.output[0].type == "message"
    usage = reply.usage
    assert usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens <= usage.input_tokens


def test_the_stream_equals_the_greedy_whole(client):
    whole = greedy(client, input=QUESTION)
    events = list(
        client.responses.create(
            model=DEFAULT_MODEL_ID,
            input=QUESTION,
            temperature=0,
            max_output_tokens=24,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] == f"response.{whole.status}"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_forced_function_tool_is_a_function_call_with_json_arguments(client):
    reply = client.responses.create(
        model=DEFAULT_MODEL_ID,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=48,
    )
    calls = [item for item in reply.output if item.type == "function_call"]
    assert len(calls) == 1, reply.output
    assert calls[0].name == "get_weather"
    arguments = json.loads(calls[0].arguments)
    jsonschema.validate(arguments, WEATHER["parameters"])
    assert calls[0].call_id


def test_a_streamed_call_sends_its_arguments_and_ends_completed(client):
    events = list(
        client.responses.create(
            model=DEFAULT_MODEL_ID,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            temperature=0,
            max_output_tokens=48,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    jsonschema.validate(json.loads(done.arguments), WEATHER["parameters"])
    assert kinds[-1] == "response.completed"
    assert events[-1].response.output[-1].type == "function_call"


def test_a_json_schema_format_gives_json_matching_it(client):
    reply = client.responses.create(
        model=DEFAULT_MODEL_ID,
        input="Name a city and its country, as JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY}},
        temperature=0,
        max_output_tokens=48,
    )
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), CITY)
    assert reply.text.format.type == "json_schema"


def test_a_chained_turn_equals_the_conversation_spelled_out(client):
    first = greedy(client, input="My name is Ada. Say hello to me.")
    chained = greedy(client, previous_response_id=first.id, input="What is my name?")
    spelled = greedy(
        client,
        input=[
            {"role": "user", "content": "My name is Ada. Say hello to me."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        store=False,
    )
    assert chained.previous_response_id == first.id
    assert chained.output_text == spelled.output_text
    assert chained.usage.input_tokens == spelled.usage.input_tokens
    assert chained.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_retrieve_and_delete(client):
    reply = client.responses.create(model=DEFAULT_MODEL_ID, input="Hi", max_output_tokens=4)
    again = client.responses.retrieve(reply.id)
    assert again.id == reply.id
    assert again.output_text == reply.output_text
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_another_tenants_response_is_a_404(client, other_client):
    reply = client.responses.create(model=DEFAULT_MODEL_ID, input="Hi", max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        other_client.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError):
        other_client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError) as caught:
        other_client.responses.create(
            model=DEFAULT_MODEL_ID, input="Hi", previous_response_id=reply.id
        )
    assert caught.value.body["param"] == "previous_response_id"
    assert client.responses.retrieve(reply.id).id == reply.id


def test_an_unknown_previous_response_is_a_404_naming_the_field(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(
            model=DEFAULT_MODEL_ID, input="Hi", previous_response_id="resp_unknown"
        )
    assert caught.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input.0.type"),
        ({"input": [{"type": "nonsense"}]}, "input.0.type"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**{"model": DEFAULT_MODEL_ID, "input": "Hi", **extra})
    assert caught.value.body["param"] == param


def test_the_largest_items_list_is_refused_for_its_length_and_costs_one_error(client):
    # 2,048 items (the cap), each small: within the body limit, too long for the context.
    items = [{"role": "user", "content": f"item {i}"} for i in range(2048)]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=DEFAULT_MODEL_ID, input=items, max_output_tokens=4)
    assert "context" in caught.value.body["message"] or "tokens" in caught.value.body["message"]
    # The stack still serves.
    assert client.responses.create(model=DEFAULT_MODEL_ID, input="Hi", max_output_tokens=2).id
