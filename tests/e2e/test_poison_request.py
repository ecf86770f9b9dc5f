"""The poison seed of issue #15: another tenant's stream is not its victim.

n=2 with seed 2**64-1 used to overflow the second sample's seed inside the
engine step, which failed every stream on the engine and answered 502 (then
again on every replica it was retried on). The seeds now wrap modulo 2**64.
"""

import json

import httpx
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from tests.e2e.tenants import new_tenant_key

pytestmark = pytest.mark.slow

VICTIM_TOKENS = 32


def chat(content: str, **fields) -> dict:
    return {
        "model": DEFAULT_MODEL_ID,
        "messages": [{"role": "user", "content": content}],
        **fields,
    }


async def test_the_poison_seed_leaves_a_running_stream_complete(stack):
    _, victim_key = await new_tenant_key(stack.redis_url, "victim")
    _, attacker_key = await new_tenant_key(stack.redis_url, "attacker")
    victim_body = chat(
        "Tell me a story.",
        max_tokens=VICTIM_TOKENS,
        ignore_eos=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    attack = chat("Hi", max_tokens=4, n=2, seed=2**64 - 1, temperature=1.0)
    victim_headers = {"Authorization": f"Bearer {victim_key}"}
    attacker_headers = {"Authorization": f"Bearer {attacker_key}"}
    client = httpx.AsyncClient(base_url=stack.gateway_url, timeout=120)
    async with (
        client,
        client.stream(
            "POST", "/v1/chat/completions", json=victim_body, headers=victim_headers
        ) as victim,
    ):
        assert victim.status_code == 200
        lines = victim.aiter_lines()
        chunks = []
        # The victim is running on the engine before the attack is sent.
        while not any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks):
            line = await anext(lines)
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
        attacked = await client.post("/v1/chat/completions", json=attack, headers=attacker_headers)
        chunks += [json.loads(line[6:]) async for line in lines if line.startswith("data: {")]
    assert attacked.status_code == 200, attacked.text
    choices = attacked.json()["choices"]
    assert sorted(c["index"] for c in choices) == [0, 1]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == VICTIM_TOKENS
