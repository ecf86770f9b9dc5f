"""Upstream errors per endpoint, breaker state and per-tenant tokens, as /metrics shows them.

The gateway's metrics port serves prometheus_client's registry as text;
reading that registry in-process gives each assertion the same text
Prometheus would scrape.
Metrics are process-wide: assertions use endpoint ids and tenants unique to
the test, or compare before and after.
"""

import asyncio
import uuid

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from maas.v1 import tokenizer_pb2
from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.parsed_request import ChatPrompt
from maas_services.common.tenant_labels import OTHER
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.upstream.prompt_encoder import PromptEncoder
from maas_services.gateway.upstream.upstreams import Upstreams
from maas_tools.local.ports import free_port
from tests.integration.gateway.conftest import CHUNKS, MODEL

Samples = dict[tuple[str, frozenset], float]


@pytest.fixture
def scrape():
    """scrape(cluster) -> {(series name, labels): value}, as the metrics port serves them."""

    async def get(cluster) -> Samples:
        await cluster.pipeline.background.wait()
        await asyncio.sleep(0.05)  # a finished call's status is counted in a task of its own
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(generate_latest().decode())
            for sample in family.samples
        }

    return get


def errors(samples: Samples, upstream: str, endpoint: str, kind: str) -> float:
    labels = frozenset({"upstream": upstream, "endpoint": endpoint, "kind": kind}.items())
    return samples.get(("maas_gateway_upstream_errors_total", labels), 0.0)


def grew(before: Samples, after: Samples, upstream: str, endpoint: str, kind: str) -> float:
    return errors(after, upstream, endpoint, kind) - errors(before, upstream, endpoint, kind)


def upstream_errors(samples: Samples, upstream: str) -> float:
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "maas_gateway_upstream_errors_total" and ("upstream", upstream) in labels
    )


def breaker(samples: Samples, endpoint: str) -> float | None:
    return samples.get(("maas_gateway_breaker_state", frozenset({("endpoint", endpoint)})))


def tenant_tokens(samples: Samples, tenant: str, kind: str) -> float:
    labels = frozenset({"tenant": tenant, "kind": kind}.items())
    return samples.get(("maas_gateway_tenant_tokens_total", labels), 0.0)


async def test_a_dead_engine_counts_connect_timeouts_and_its_breaker_opens(make_cluster, scrape):
    cluster = await make_cluster(
        replicas=1, breaker_failures=2, breaker_cooldown_seconds=1.0, connect_timeout_seconds=0.2
    )
    # The breakers read a clock the test moves: on a loaded machine four requests
    # can take longer than the cooldown, and a real clock would let the dead
    # replica be probed a third time.
    now = [1000.0]
    cluster.pipeline.engine._breakers._clock = lambda: now[0]
    dead = f"dead-{uuid.uuid4().hex[:8]}"
    cluster.router.endpoints.append((dead, f"127.0.0.1:{free_port()}", MODEL))
    for _ in range(4):  # round robin: the dead replica is picked first every other request
        await cluster.run()
    assert cluster.router.picks.count(dead) == 2
    samples = await scrape(cluster)
    assert errors(samples, "engine", dead, "connect_timeout") == 2
    assert breaker(samples, dead) == 1
    assert breaker(samples, "e0") is not None  # closed endpoints are exported too

    # The cooldown runs out with no request at all: the gauge reads half-open.
    now[0] += 1.0
    assert breaker(await scrape(cluster), dead) == 0.5

    # The router stops listing the replica: its breaker and series go; the counter stays.
    cluster.router.endpoints = [e for e in cluster.router.endpoints if e[0] != dead]
    await cluster.run()
    samples = await scrape(cluster)
    assert breaker(samples, dead) is None
    assert errors(samples, "engine", dead, "connect_timeout") == 2


async def test_engine_failures_are_counted_by_code_and_router_answers_are_not(make_cluster, scrape):
    cluster = await make_cluster(replicas=1)
    before = await scrape(cluster)
    cluster.engines[0].fail = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(APIError):
        await cluster.run()
    cluster.engines[0].fail = grpc.StatusCode.INVALID_ARGUMENT  # the request's fault
    with pytest.raises(APIError):
        await cluster.run()
    after = await scrape(cluster)
    assert grew(before, after, "engine", "e0", "unavailable") == 1
    assert upstream_errors(after, "engine") - upstream_errors(before, "engine") == 1
    # The retry's Pick found no replica left (UNAVAILABLE): an answer, not a router failure.
    assert upstream_errors(after, "router") == upstream_errors(before, "router")


async def test_a_first_token_timeout_is_counted_once(make_cluster, scrape):
    cluster = await make_cluster(replicas=1, first_token_timeout_seconds=0.2)
    cluster.engines[0].hang = True
    before = await scrape(cluster)
    with pytest.raises(APIError) as caught:
        await cluster.run()
    assert caught.value.status == 504
    after = await scrape(cluster)
    assert grew(before, after, "engine", "e0", "first_token_timeout") == 1
    # The gateway cancelled the stream: CANCELLED is not counted again.
    assert upstream_errors(after, "engine") - upstream_errors(before, "engine") == 1


async def test_an_unreachable_tokenizer_is_counted_under_its_address(make_cluster, scrape):
    cluster = await make_cluster(replicas=1)
    # A tokenizer at 127.0.0.1:1, where nothing listens.
    upstreams = Upstreams("127.0.0.1:1", "127.0.0.1:1")
    before = await scrape(cluster)
    message = tokenizer_pb2.ChatMessage(role="user", content="hi")
    try:
        with pytest.raises(APIError):
            await PromptEncoder(upstreams.tokenizer).encode(MODEL, ChatPrompt([message]), None)
    finally:
        await upstreams.close()
    after = await scrape(cluster)
    assert grew(before, after, "tokenizer", "127.0.0.1:1", "unavailable") == 1


async def test_tenant_tokens_are_counted_only_when_configured_and_bounded(make_cluster, scrape):
    tag = uuid.uuid4().hex[:8]
    plain = await make_cluster(replicas=1)
    await plain.run(Tenant(name=f"off-{tag}"))
    samples = await scrape(plain)
    assert tenant_tokens(samples, f"off-{tag}", "completion") == 0

    cluster = await make_cluster(replicas=1, metrics_tenant_labels=1)
    before = await scrape(cluster)
    await cluster.run(Tenant(name=f"first-{tag}"))
    await cluster.run(Tenant(name=f"second-{tag}"))
    after = await scrape(cluster)
    assert tenant_tokens(after, f"first-{tag}", "completion") == len(CHUNKS)
    assert tenant_tokens(after, f"first-{tag}", "prompt") == 3
    assert tenant_tokens(after, f"second-{tag}", "completion") == 0
    assert tenant_tokens(after, OTHER, "completion") - tenant_tokens(
        before, OTHER, "completion"
    ) == len(CHUNKS)
