"""vLLM demands its key; the adapter in front shows it (every other test here goes through it)."""

import httpx
import pytest

from maas_services.engine.vllm_backend.server import vllm_client
from tests.integration.vllm.conftest import PROMPT, SERVED_MODEL

pytestmark = pytest.mark.slow


async def test_vllm_refuses_a_caller_without_its_key(vllm_server):
    body = {"model": SERVED_MODEL, "prompt": PROMPT, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=60) as anyone:
        assert (await anyone.post("/v1/completions", json=body)).status_code == 401
        wrong = {"Authorization": "Bearer not-the-key"}
        assert (await anyone.get("/v1/models", headers=wrong)).status_code == 401


async def test_the_adapters_client_shows_the_key_from_its_environment(vllm_server, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", vllm_server.config.api_key)
    async with vllm_client(vllm_server.url) as client:
        models = (await client.get("/v1/models")).raise_for_status().json()["data"]
    assert models[0]["id"] == SERVED_MODEL
