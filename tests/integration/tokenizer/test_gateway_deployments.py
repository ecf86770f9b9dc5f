"""One gateway, two models with different tokenizers: each request is tokenized by its own.

Over HTTP (the ASGI app) to the gateway's pipeline, real gRPC to the real
tokenizer service (SmolLM2's GGUF as the default deployment, the toy folder
beside it) and to stub engines and router that record what reached them.
"""

import uuid

import httpx
import pytest

from maas.v1 import engine_pb2_grpc, router_pb2_grpc
from maas_services.common.redis_client import open_redis
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_services.gateway.server import build_pipeline
from maas_services.gateway.settings import GatewaySettings
from maas_services.gateway.upstream.upstreams import Upstreams
from maas_services.tokenizer.server import start_tokenizer
from maas_services.tokenizer.settings import TokenizerSettings, TokenizerSource
from tests.integration.gateway.stubs import StubEngine, StubRouter, start
from tests.integration.tokenizer.toy_model import MAX_MODEL_LEN

ROUTES = """
models:
  smol-chat: {routes: [{deployment: smol}]}
  toy-chat: {routes: [{deployment: toy}]}
"""
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


class RecordingEngine(StubEngine):
    def __init__(self, model: str):
        super().__init__(model, ["Paris", "."])
        self.requests = []

    async def Generate(self, request, context):
        self.requests.append(request)
        async for response in super().Generate(request, context):
            yield response


@pytest.fixture
async def gateway(tokenizer, toy_model, redis_url, tmp_path):
    """(HTTP client, {deployment: its engine})."""
    servers, engines, endpoints = [], {}, []
    for deployment in ("smol", "toy"):
        engines[deployment] = RecordingEngine(deployment)
        server, address = await start(
            engines[deployment], engine_pb2_grpc.add_EngineServicer_to_server
        )
        servers.append(server)
        endpoints.append((f"{deployment}-0", address, deployment))
    server, router_address = await start(
        StubRouter(endpoints), router_pb2_grpc.add_RouterServicer_to_server
    )
    servers.append(server)
    settings = TokenizerSettings(
        model_id="smol", tokenizer_models={"toy": TokenizerSource(path=str(toy_model))}
    )
    handle, pool = await start_tokenizer(settings, tokenizer)
    upstreams = Upstreams(f"127.0.0.1:{handle.port}", router_address)
    redis = open_redis(redis_url)
    routes_file = tmp_path / "routes.yaml"
    routes_file.write_text(ROUTES)
    config = GatewaySettings(
        redis_url=redis_url,
        router_address=router_address,
        models_cache_seconds=0,
        usage_spool_dir=str(tmp_path / "spool"),
    )
    pipeline = build_pipeline(config, upstreams, redis, RoutesWatcher(str(routes_file)))
    store = TenantStore(redis)
    tenant = await store.create_tenant(f"two-models-{uuid.uuid4().hex[:8]}")
    _, api_key = await store.create_key(tenant.name)
    app = create_app(Gateway(pipeline, Authenticator(store), redis, 1 << 20))
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers) as c:
        yield c, engines
    await pipeline.background.wait()
    await upstreams.close()
    await handle.server.stop(0)
    pool.shutdown()
    for server in servers:
        await server.stop(0)
    await redis.aclose()


def chat(model: str, **body) -> dict:
    return {"model": model, "messages": MESSAGES, **body}


async def test_each_model_is_tokenized_by_its_deployments_tokenizer(gateway, tokenizer, toy_model):
    client, engines = gateway
    for model in ("smol-chat", "toy-chat"):
        answer = await client.post("/v1/chat/completions", json=chat(model, max_tokens=2))
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "Paris."
    smol, toy = engines["smol"].requests, engines["toy"].requests
    assert [list(r.prompt_token_ids) for r in smol] == [tokenizer.encode_chat(MESSAGES)]
    assert [list(r.prompt_token_ids) for r in toy] == [
        load_tokenizer(toy_model).encode_chat(MESSAGES)
    ]
    assert smol[0].prompt_token_ids != toy[0].prompt_token_ids


async def test_the_context_length_is_the_deployments(gateway):
    client, engines = gateway
    # Room for 100 tokens in SmolLM2's 8192, not in the toy's 64.
    assert (
        await client.post("/v1/chat/completions", json=chat("smol-chat", max_tokens=100))
    ).status_code == 200
    refused = await client.post("/v1/chat/completions", json=chat("toy-chat", max_tokens=100))
    assert refused.status_code == 400
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in refused.json()["error"]["message"]
    assert not engines["toy"].requests

    # max_tokens unset: what the toy's context has left after the prompt.
    assert (await client.post("/v1/chat/completions", json=chat("toy-chat"))).status_code == 200
    (request,) = engines["toy"].requests
    assert request.sampling.max_tokens == MAX_MODEL_LEN - len(request.prompt_token_ids)
