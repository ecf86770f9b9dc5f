"""Every service exposes Prometheus metrics named maas_<service>_*."""

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from maas_services.common.model_files import DEFAULT_MODEL_ID

pytestmark = pytest.mark.slow


def samples(url: str) -> dict[str, float]:
    text = httpx.get(url, timeout=10).text
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(name + "["))


def test_one_request_moves_every_services_counters(stack):
    before = {name: samples(url) for name, url in stack.metrics_urls.items()}
    client = openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key)
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    after = {name: samples(url) for name, url in stack.metrics_urls.items()}

    def grew(service: str, name: str) -> float:
        return total(after[service], name) - total(before[service], name)

    assert grew("engine-0", "maas_engine_generation_tokens_total") == reply.usage.completion_tokens
    assert grew("engine-0", "maas_engine_prompt_tokens_total") == reply.usage.prompt_tokens
    assert grew("engine-0", "maas_engine_grpc_server_handled_total") >= 1
    assert grew("tokenizer", "maas_tokenizer_grpc_server_handled_total") >= 1
    assert grew("router", "maas_router_picks_total") == 1
    assert grew("gateway", "maas_gateway_grpc_client_handled_total") >= 3
    # The engine also speaks the inference extension's model-server protocol,
    # whose series carry vLLM's names (docs/gie.md).
    assert all(
        name.startswith(("maas_", "python_", "process_"))
        or (service.startswith("engine") and name.startswith("vllm:"))
        for service, names in after.items()
        for name in names
    )
