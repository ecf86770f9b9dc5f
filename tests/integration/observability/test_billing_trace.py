"""Billing continues the request's trace from the usage event, and counts per tenant once."""

import asyncio
import time
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from prometheus_client import REGISTRY

from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.tenant_metrics import OTHER, TenantMetrics
from maas_services.common.redis_client import open_redis
from maas_services.common.tracing import current_traceparent
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from tests.unit.common.span_capture import captured_spans

tracer = trace.get_tracer("test")


@pytest.fixture
def spans():
    return captured_spans()


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


def usage(tenant: str, traceparent: str = "") -> UsageEvent:
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="m",
        prompt_tokens=7,
        completion_tokens=3,
        started_at=time.time(),
        traceparent=traceparent,
    )


async def fresh_group(redis) -> str:
    """A consumer group that starts after what is on the stream now: the stream is
    the session's, and what earlier tests left there is not this test's."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    await redis.xgroup_create(USAGE_STREAM, group, id="$", mkstream=True)
    return group


async def consume(redis, group: str) -> None:
    """The group reads what was added since it was made, then stops."""
    consumer = UsageConsumer(redis, group, "c0", batch=100, block_ms=100)
    task = asyncio.create_task(consumer.run())
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def commits(spans, request_id: str) -> list:
    return [
        s for s in spans.get_finished_spans() if s.attributes.get("maas.request_id") == request_id
    ]


def billed(tenant: str, kind: str) -> float:
    sample = "maas_billing_tenant_tokens_total"
    return REGISTRY.get_sample_value(sample, {"tenant": tenant, "kind": kind}) or 0.0


async def test_the_commit_is_a_span_in_the_requests_trace(redis, spans):
    with tracer.start_as_current_span("gateway request") as request:
        event = usage(f"t-{uuid.uuid4().hex[:6]}", current_traceparent())
    group = await fresh_group(redis)
    await redis.xadd(USAGE_STREAM, event.to_fields())
    await consume(redis, group)
    (commit,) = commits(spans, event.request_id)
    assert commit.kind == SpanKind.CONSUMER
    assert commit.context.trace_id == request.get_span_context().trace_id
    assert commit.parent.span_id == request.get_span_context().span_id
    assert commit.attributes["maas.billing.outcome"] == "applied"
    assert commit.attributes["maas.billing.lag_seconds"] >= 0


async def test_a_duplicate_is_traced_but_billed_once(redis, spans):
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    event = usage(tenant)
    group = await fresh_group(redis)
    for _ in range(2):
        await redis.xadd(USAGE_STREAM, event.to_fields())
    await consume(redis, group)
    outcomes = [s.attributes["maas.billing.outcome"] for s in commits(spans, event.request_id)]
    assert outcomes == ["applied", "duplicate"]
    # An event from before traceparent existed starts a trace of its own.
    assert all(s.parent is None for s in commits(spans, event.request_id))
    assert (billed(tenant, "prompt"), billed(tenant, "completion")) == (7, 3)


def test_tenants_past_the_limit_share_one_label():
    labels = TenantMetrics(limit=2)
    assert [labels.label(t) for t in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]
