"""POST /v1/embeddings through the gateway's HTTP app, on stub engines that embed:
shapes, both encodings, billing, what a deployment serves, limits, and bad input."""

import asyncio
import base64
import re
import struct
import uuid

import grpc
import pytest

from maas_services.common.openai_api.embeddings import MAX_INPUTS
from maas_services.common.redis_client import open_redis
from maas_services.common.serves import EMBED, GENERATE
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.routes.embeddings import IN_FLIGHT
from maas_services.gateway.responses.store import StoreLimits
from tests.integration.gateway.conftest import MODEL
from tests.integration.gateway.embedding_stubs import stub_vector, with_serves
from tests.integration.gateway.responses_api import open_api
from tests.integration.gateway.usage_stream import usage_events


@pytest.fixture
async def api(make_cluster, redis_url, tmp_path, monkeypatch):
    """api(**make_cluster arguments) -> (the app, its cluster), on embedding stubs."""
    with_serves(monkeypatch)
    opened = []

    async def make(replicas: int = 1, **settings):
        cluster = await make_cluster(replicas=replicas, **settings)
        database = f"sqlite+aiosqlite:///{tmp_path}/responses-{len(opened)}.db"
        made, close = await open_api(cluster, redis_url, database, StoreLimits())
        opened.append(close)
        return made, cluster

    yield make
    for close in opened:
        await close()


async def embed(app, key: str | None = None, **body):
    """POST /v1/embeddings with the app's first tenant's key, or `key`."""
    headers = {"authorization": f"Bearer {key}"} if key else app._auth(None)
    return await app.client.post("/v1/embeddings", json={"model": MODEL, **body}, headers=headers)


async def tenant_key(redis_url: str, **limits) -> tuple[str, str]:
    """(a new tenant's name, its key), with these limits."""
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        name = f"emb-{uuid.uuid4().hex[:8]}"
        await store.create_tenant(name, **limits)
        return name, (await store.create_key(name))[1]
    finally:
        await redis.aclose()


def floats(encoded: str) -> list[float]:
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


async def test_a_string_is_embedded_in_openais_shape(api):
    app, cluster = await api()
    response = await embed(app, input="The cat sat on the mat.")
    assert response.status_code == 200, response.text
    body = response.json()
    # The stub tokenizer encodes any text as [1, 2, 3].
    assert body == {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": stub_vector([1, 2, 3])}],
        "model": MODEL,
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    (request,) = cluster.engines[0].embedded
    assert request.sampling.max_tokens == 0
    assert response.headers["x-request-id"]


async def test_a_list_keeps_its_order_and_usage_sums_its_inputs(api):
    app, _ = await api(replicas=2)
    inputs = [[100 + i] * (i + 1) for i in range(20)]
    body = (await embed(app, input=inputs)).json()
    assert [d["index"] for d in body["data"]] == list(range(20))
    assert [d["embedding"] for d in body["data"]] == [stub_vector(ids) for ids in inputs]
    total = sum(len(ids) for ids in inputs)
    assert body["usage"] == {"prompt_tokens": total, "total_tokens": total}


async def test_token_ids_and_strings_are_both_inputs(api):
    app, _ = await api()
    ids = (await embed(app, input=[7, 8, 9, 10])).json()
    assert ids["data"][0]["embedding"] == stub_vector([7, 8, 9, 10])
    texts = (await embed(app, input=["one", "two"])).json()
    assert [d["embedding"] for d in texts["data"]] == [stub_vector([1, 2, 3])] * 2


async def test_base64_is_the_float_vector_as_little_endian_float32(api):
    app, _ = await api()
    inputs = [[3, 4, 5], [6]]
    as_floats = (await embed(app, input=inputs)).json()
    as_base64 = (await embed(app, input=inputs, encoding_format="base64")).json()
    for plain, packed in zip(as_floats["data"], as_base64["data"], strict=True):
        assert isinstance(packed["embedding"], str)
        assert floats(packed["embedding"]) == pytest.approx(plain["embedding"])
    assert as_base64["usage"] == as_floats["usage"]


async def test_dimensions_reach_the_engine(api):
    app, cluster = await api()
    body = (await embed(app, input=[5, 6], dimensions=2)).json()
    assert body["data"][0]["embedding"] == stub_vector([5, 6], 2)
    assert cluster.engines[0].embedded[-1].sampling.embedding.dimensions == 2


async def test_each_input_is_billed_as_input_tokens_only(api, redis_url):
    app, _ = await api()
    tenant, key = await tenant_key(redis_url)
    inputs = [[11] * 4, [12] * 6, [13] * 9]
    assert (await embed(app, key, input=inputs)).status_code == 200
    events = await usage_events(redis_url, tenant)
    assert sorted(e.prompt_tokens for e in events) == [4, 6, 9]
    assert {e.completion_tokens for e in events} == {0}
    assert {e.finish_reason for e in events} == {"stop"}
    assert len({e.request_id for e in events}) == 3


async def test_a_key_s_concurrency_bounds_its_inputs_in_flight_and_none_is_refused(api, redis_url):
    app, cluster = await api()
    cluster.engines[0].embed_delay = 0.01
    _, key = await tenant_key(redis_url, max_concurrency=2)
    response = await embed(app, key, input=[[i + 1] for i in range(24)])
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 24
    assert cluster.engines[0].embedding_peak <= 2


async def test_long_inputs_go_few_at_a_time_and_short_ones_many(api):
    app, cluster = await api()
    engine = cluster.engines[0]
    engine.embed_delay = 0.2
    # 600 tokens each: a second would pass the request's 1024 tokens in flight.
    assert (await embed(app, input=[[7] * 600] * 4)).status_code == 200
    assert engine.embedding_peak == 1
    engine.embedding_peak = 0
    response = await embed(app, input=[[7] * 5] * 24)
    assert response.status_code == 200
    assert 1 < engine.embedding_peak <= IN_FLIGHT


async def test_a_list_longer_than_the_keys_rpm_is_refused_before_any_work(api, redis_url):
    app, cluster = await api()
    _, key = await tenant_key(redis_url, rpm=5)
    response = await embed(app, key, input=[[1]] * 6)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"
    assert "5 requests per minute" in response.json()["error"]["message"]
    assert cluster.engines[0].embedded == []
    assert (await embed(app, key, input=[[1]] * 5)).status_code == 200


async def test_a_deployment_that_does_not_embed_is_a_400_naming_the_model(api):
    app, cluster = await api()
    cluster.router.serves = [GENERATE]
    response = await embed(app, input="hello")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model"
    assert "does not serve embeddings" in error["message"]
    assert cluster.engines[0].embedded == []


async def test_an_engine_that_refuses_an_embedding_is_a_400(api):
    # The router has not yet heard what the engine serves: the engine's own refusal.
    app, cluster = await api()
    cluster.engines[0].serves = [GENERATE]
    response = await embed(app, input="hello")
    assert response.status_code == 400
    assert "does not serve embed" in response.json()["error"]["message"]


async def test_a_completion_to_an_embedding_only_deployment_is_a_400(api):
    app, cluster = await api()
    cluster.router.serves = [EMBED]
    response = await app.client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers=app._auth(None),
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "model"
    assert "/v1/embeddings" in error["message"]


async def test_an_input_over_the_context_is_a_400_naming_the_input(api):
    app, cluster = await api()
    too_long = "This model's maximum context length is 2048 tokens."
    cluster.tokenizer.refuse = (grpc.StatusCode.INVALID_ARGUMENT, too_long)
    response = await embed(app, input="a text too long")
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": too_long,
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }
    # In a list, the message says which input.
    response = await embed(app, input=["a text too long"] * 3)
    assert re.fullmatch(
        r"input\[[0-2]\]: " + re.escape(too_long), response.json()["error"]["message"]
    )


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": ""}, "input", "empty string"),
        ({"input": []}, "input", "empty list"),
        ({"input": ["a", ""]}, "input", "empty string or list"),
        ({"input": [[1], []]}, "input", "empty string or list"),
        ({"input": ["a", 1]}, "input", "a list of strings"),
        ({"input": [1, -2]}, "input", "token ids must be integers"),
        ({"input": {"text": "a"}}, "input", "a list of strings"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
        ({}, "input", "required"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "float"),
        ({"input": "a", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
        ({"input": "a", "model": ""}, "model", "at least 1"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(api, body, param, words):
    app, cluster = await api()
    response = await embed(app, **body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]
    assert cluster.engines[0].embedded == []


async def test_the_largest_request_costs_only_its_sender(api, redis_url):
    """2048 long inputs from one key, while another tenant's completions are
    served from the same two slots: the fair queue gives them their share, so
    they all finish while the big request is still being embedded."""
    routes = f"deployments:\n  {MODEL}:\n    max_in_flight: 2\n"
    app, cluster = await api(routes=routes)
    cluster.engines[0].embed_delay = 0.002
    _, big_key = await tenant_key(redis_url)
    _, small_key = await tenant_key(redis_url)
    long_text = "a long input that the tokenizer must read " * 35
    big = asyncio.create_task(embed(app, big_key, input=[long_text] * MAX_INPUTS))
    while len(cluster.engines[0].embedded) < 50:
        await asyncio.sleep(0.01)
    for _ in range(10):
        response = await app.client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 3},
            headers={"authorization": f"Bearer {small_key}"},
        )
        assert response.status_code == 200, response.text
    assert not big.done()
    answer = await big
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"]) == MAX_INPUTS
