"""The gateway's request span describes the generation in OpenTelemetry's GenAI terms."""

import uuid

import httpx
import pytest
from opentelemetry.trace import SpanKind

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from tests.integration.gateway.conftest import MODEL
from tests.unit.common.span_capture import captured_spans

CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, "chat")
TEXT = ("/v1/completions", {"prompt": "Hi"}, "text_completion")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body", "operation"), [CHAT, TEXT], ids=["chat", "text"])
async def test_the_request_span_has_the_gen_ai_attributes(
    make_cluster, redis_url, path, body, operation, stream
):
    cluster = await make_cluster(replicas=1)
    spans = captured_spans()
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        tenant = await store.create_tenant(f"genai-{uuid.uuid4().hex[:8]}")
        _, api_key = await store.create_key(tenant.name)
        app = create_app(Gateway(cluster.pipeline, Authenticator(store), redis, 1 << 20))
        request = {
            "model": MODEL,
            "max_tokens": 3,
            "temperature": 0.25,
            "stream": stream,
            "stream_options": {"include_usage": True} if stream else None,
            **body,
        }
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            response = await client.post(
                path,
                json={k: v for k, v in request.items() if v is not None},
                headers={"authorization": f"Bearer {api_key}"},
            )
        await cluster.pipeline.background.wait()
    finally:
        await redis.aclose()
    assert response.status_code == 200, response.text
    (span,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    attributes = {k: v for k, v in span.attributes.items() if k.startswith("gen_ai.")}
    assert attributes.pop("gen_ai.usage.input_tokens") > 0
    assert attributes == {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": MODEL,
        "gen_ai.request.max_tokens": 3,
        "gen_ai.request.temperature": 0.25,
        "gen_ai.response.model": MODEL,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.response.finish_reasons": ("stop",),
    }
