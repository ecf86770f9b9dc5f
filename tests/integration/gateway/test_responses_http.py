"""POST/GET/DELETE /v1/responses through the gateway's HTTP app: shapes, events,
tool calls, chaining, tenant isolation of stored responses, and bad input."""

import json

import pytest

from maas_services.gateway.responses.store import StoreLimits
from tests.integration.gateway.conftest import CHUNKS, MODEL
from tests.integration.gateway.responses_api import events, open_api

TEXT = "".join(CHUNKS)
CALL = ['<tool_call>{"name": "weather", ', '"arguments": {"city": "Paris"}}', "</tool_call>"]
WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
async def api(make_cluster, redis_url, tmp_path):
    opened = []

    async def make(chunks=CHUNKS, limits: StoreLimits | None = None, **settings):
        cluster = await make_cluster(replicas=1, chunks=chunks, **settings)
        database = f"sqlite+aiosqlite:///{tmp_path}/responses-{len(opened)}.db"
        made, close = await open_api(cluster, redis_url, database, limits or StoreLimits())
        opened.append(close)
        return made

    yield make
    for close in opened:
        await close()


async def test_a_response_is_returned_stored_retrieved_and_deleted(api):
    app = await api()
    created = await app.create(model=MODEL, input="Hi", instructions="Be brief.")
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["id"].startswith("resp_")
    assert body["object"] == "response"
    assert body["status"] == "completed"
    assert body["store"] is True
    assert body["instructions"] == "Be brief."
    [message] = body["output"]
    assert message["type"] == "message"
    assert message["role"] == "assistant"
    assert message["status"] == "completed"
    assert message["content"] == [
        {"type": "output_text", "text": TEXT, "annotations": [], "logprobs": []}
    ]
    usage = body["usage"]
    assert usage["output_tokens"] == len(CHUNKS)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["input_tokens_details"]["cached_tokens"] == 0

    retrieved = await app.get(body["id"])
    assert retrieved.status_code == 200
    assert retrieved.json() == body

    deleted = await app.delete(body["id"])
    assert deleted.json() == {"id": body["id"], "object": "response", "deleted": True}
    assert (await app.get(body["id"])).status_code == 404
    assert (await app.delete(body["id"])).status_code == 404


async def test_the_stream_is_openais_event_sequence_and_sums_to_the_whole(api):
    app = await api()
    whole = (await app.create(model=MODEL, input="Hi")).json()
    streamed = events(await app.create(model=MODEL, input="Hi", stream=True))
    kinds = [e["type"] for e in streamed]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(CHUNKS),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    assert streamed[0]["response"]["status"] == "in_progress"
    assert streamed[0]["response"]["output"] == []
    assert streamed[0]["response"]["store"] is True
    deltas = [e["delta"] for e in streamed if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == TEXT == streamed[-4]["text"]
    final = streamed[-1]["response"]
    assert final["output"][0]["content"] == whole["output"][0]["content"]
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    # What the last event says is what is stored.
    assert (await app.get(final["id"])).json() == final


async def test_a_function_tool_call_is_a_function_call_item(api):
    app = await api(chunks=["Let me check. ", *CALL])
    body = (await app.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])).json()
    assert [item["type"] for item in body["output"]] == ["message", "function_call"]
    assert body["output"][0]["content"][0]["text"] == "Let me check. "
    call = body["output"][1]
    assert call["name"] == "weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert call["call_id"].startswith("call_")
    assert body["status"] == "completed"

    streamed = events(
        await app.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER], stream=True)
    )
    kinds = [e["type"] for e in streamed]
    at = kinds.index("response.function_call_arguments.delta")
    assert kinds[at - 1 : at + 3] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert streamed[at - 1]["item"]["arguments"] == ""
    assert json.loads(streamed[at + 1]["arguments"]) == {"city": "Paris"}
    assert streamed[-1]["response"]["output"][1]["name"] == "weather"


async def test_a_call_and_its_output_chain_into_the_next_turn(api):
    app = await api(chunks=CALL)
    first = (await app.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])).json()
    call = first["output"][-1]
    second = await app.create(
        model=MODEL,
        previous_response_id=first["id"],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}],
        tools=[WEATHER],
    )
    assert second.status_code == 200, second.text
    assert second.json()["previous_response_id"] == first["id"]
    # The same conversation spelled out as items is accepted as well.
    spelled = await app.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {key: call[key] for key in ("type", "call_id", "name", "arguments")},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        ],
        tools=[WEATHER],
        store=False,
    )
    assert spelled.status_code == 200, spelled.text
    assert spelled.json()["store"] is False
    assert (await app.get(spelled.json()["id"])).status_code == 404


async def test_the_token_limit_makes_an_incomplete_response(api):
    app = await api()
    body = (
        await app.create(
            model=MODEL,
            input="Hi",
            max_output_tokens=2,
            tool_choice="none",
            temperature=0,
        )
    ).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert body["usage"]["output_tokens"] == 2
    assert body["text"] == {"format": {"type": "text"}}
    assert body["tool_choice"] == "none"
    assert body["max_output_tokens"] == 2
    assert body["temperature"] == 0
    streamed = events(await app.create(model=MODEL, input="Hi", max_output_tokens=2, stream=True))
    assert streamed[-1]["type"] == "response.incomplete"


async def test_another_tenants_response_is_not_found(api):
    app = await api()
    owner, other = app.tenants
    created = (await app.create(owner, model=MODEL, input="Hi")).json()
    assert (await app.get(created["id"], other)).status_code == 404
    assert (await app.delete(created["id"], other)).status_code == 404
    chained = await app.create(other, model=MODEL, input="Hi", previous_response_id=created["id"])
    assert chained.status_code == 404
    assert chained.json()["error"]["param"] == "previous_response_id"
    # Still the owner's.
    assert (await app.get(created["id"], owner)).status_code == 200


async def test_an_unknown_previous_response_is_a_404_naming_the_field(api):
    app = await api()
    reply = await app.create(model=MODEL, input="Hi", previous_response_id="resp_nope")
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert error["param"] == "previous_response_id"
    assert "resp_nope" in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type", "'web_search'"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type", "reasoning"),
        ({"input": [{"type": "computer_call"}]}, "input.0.type", "'computer_call'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0.type",
            "'input_image'",
        ),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type", "'file_search'"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort", "reasoning"),
        ({"background": True}, "background", "background"),
        ({"input": []}, "input", "empty"),
        ({"input": [{"role": "user", "content": "x"}] * 2049}, "input", "2048"),
        (
            {"text": {"format": {"type": "json_schema", "name": "bad name!", "schema": {}}}},
            "text.format.name",
            "pattern",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}},
            "tool_choice",
            "'other'",
        ),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(api, body, param, words):
    app = await api()
    reply = await app.create(**{"model": MODEL, "input": "Hi", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]


async def test_the_store_stays_within_each_tenants_bounds_under_a_flood(api):
    app = await api(limits=StoreLimits(max_per_tenant=5, max_bytes_per_tenant=64 * 1024))
    flooder, victim = app.tenants
    kept = (await app.create(victim, model=MODEL, input="mine")).json()["id"]
    ids = []
    # Each response holds ~5 KB of input: the byte bound binds before the count.
    for _ in range(30):
        reply = await app.create(flooder, model=MODEL, input="x" * 5000)
        assert reply.status_code == 200
        ids.append(reply.json()["id"])
    count, size = await app.store.usage(flooder)
    assert count <= 5
    assert size <= 64 * 1024
    # The newest are kept, the oldest went; the other tenant lost nothing.
    assert (await app.get(ids[-1], flooder)).status_code == 200
    assert (await app.get(ids[0], flooder)).status_code == 404
    assert (await app.get(kept, victim)).status_code == 200
    assert (await app.store.usage(victim))[0] == 1


async def test_a_response_over_the_whole_byte_bound_is_answered_not_stored(api):
    app = await api(limits=StoreLimits(max_bytes_per_tenant=4096))
    earlier = (await app.create(model=MODEL, input="small")).json()
    big = (await app.create(model=MODEL, input="y" * 8000)).json()
    assert big["status"] == "completed"
    assert big["store"] is False
    assert (await app.get(big["id"])).status_code == 404
    # Nothing was evicted for it.
    assert (await app.get(earlier["id"])).status_code == 200


async def test_bodies_and_events_validate_as_the_openai_sdks_types(api):
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    app = await api(chunks=["Sure. ", *CALL])
    body = (await app.create(model=MODEL, input="Weather?", tools=[WEATHER])).json()
    assert Response.model_validate(body).output_text == "Sure. "
    adapter = TypeAdapter(ResponseStreamEvent)
    streamed = events(await app.create(model=MODEL, input="Weather?", tools=[WEATHER], stream=True))
    for event in streamed:
        assert adapter.validate_python(event).type == event["type"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_with_a_blocked_term_ends_the_response_incomplete(api, stream):
    app = await api(
        chunks=["Checking. ", *CALL, " more text"],
        blocked_terms=["paris"],
        blocked_terms_action="stop",
    )
    reply = await app.create(model=MODEL, input="Weather?", tools=[WEATHER], stream=stream)
    body = events(reply)[-1]["response"] if stream else reply.json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "content_filter"}
    assert [item["type"] for item in body["output"]] == ["message"]
    assert "more text" not in body["output"][0]["content"][0]["text"]
