"""The vLLM adapter's HTTP client shows vLLM's key from its environment, and none without one.
(Against a real vLLM that demands it: tests/integration/vllm/test_vllm_api_key.py.)"""

from maas_services.engine.vllm_backend.server import vllm_client


async def test_the_key_in_the_environment_is_the_bearer_of_every_call(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "k-123")
    async with vllm_client("http://127.0.0.1:8000") as client:
        request = client.build_request("POST", "/v1/completions", json={})
    assert request.headers["Authorization"] == "Bearer k-123"


async def test_no_key_no_header(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    async with vllm_client("http://127.0.0.1:8000") as client:
        request = client.build_request("GET", "/v1/models")
    assert "Authorization" not in request.headers
