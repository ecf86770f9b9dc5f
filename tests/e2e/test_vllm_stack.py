"""`maas up --engine-backend vllm` with two vLLM replicas, called with the official openai SDK.

Local mode's vLLM path end to end: each replica a real vLLM server (CPU build)
behind `maas serve engine --backend vllm`, the gateway, router and billing the
native path's. Skips without vLLM unless MAAS_REQUIRE_VLLM is set (CI).
"""

import asyncio
import time

import httpx
import openai
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig
from maas_tools.local.vllm_replicas import VllmOptions
from tests.conftest import run_stack
from tests.e2e.tenants import new_tenant_key
from tests.integration.vllm.conftest import vllm_python  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow

# Long enough that a replica holding it is told apart by its cache (vLLM's
# blocks are whole: 16 tokens each here).
PREFIX_WORDS = 300


@pytest.fixture(scope="module")
def vllm_stack(vllm_python, tmp_path_factory) -> Stack:  # noqa: F811 (the fixture)
    config = StackConfig(
        state_dir=tmp_path_factory.mktemp("maas-vllm"),
        gateway_port=free_port(),
        engine_replicas=2,
        engine_backend="vllm",
        startup_timeout=600,
        # Eager: the cheapest start that is right on every CPU (float32 on AMX, where
        # eager bf16 is wrong; a compiled start costs minutes: docs/vllm-backend.md).
        vllm=VllmOptions(kv_cache_gib=1, max_num_seqs=8, enforce_eager=True),
    )
    yield from run_stack(config)


@pytest.fixture(scope="module")
def tenant(vllm_stack) -> str:
    return asyncio.run(new_tenant_key(vllm_stack.redis_url, "vllm"))


def sdk(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_greedy_answer_is_vllms_own(vllm_stack, tenant):
    question = ask("What is the capital of France?")
    ours = sdk(f"{vllm_stack.gateway_url}/v1", tenant[1]).chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=question, temperature=0, max_tokens=24
    )
    # The same request straight to a replica's vLLM: our tokenizer rendered the
    # chat template and sent token ids, so the answer must be token for token vLLM's.
    # vLLM demands the key only its engine holds (docs/security.md).
    vllm_key = vllm_stack.engine_envs["engine-0"]["VLLM_API_KEY"]
    theirs = sdk(f"{vllm_stack.vllm_urls['vllm-0']}/v1", vllm_key).chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=question, temperature=0, max_tokens=24
    )
    assert "Paris" in ours.choices[0].message.content
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens


def test_stream_with_usage_is_billed_as_used(vllm_stack):
    name, key = asyncio.run(new_tenant_key(vllm_stack.redis_url, "vllm-bill"))
    client = sdk(f"{vllm_stack.gateway_url}/v1", key)
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL_ID,
            messages=ask("Name three colours."),
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and not chunks[-1].choices
    assert usage.completion_tokens == 12 or chunks[-2].choices[0].finish_reason == "stop"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    deadline = time.monotonic() + 60
    while True:
        reply = httpx.get(
            f"{vllm_stack.gateway_url}/v1/usage",
            params={"granularity": "hour"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        totals = reply.json()["totals"]
        if totals["total_tokens"] == usage.total_tokens or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert totals["prompt_tokens"] == usage.prompt_tokens
    assert totals["completion_tokens"] == usage.completion_tokens


def _served(stack: Stack) -> dict[str, float]:
    """Requests each replica's vLLM has finished, from its own /metrics."""
    counts = {}
    for name, url in stack.vllm_urls.items():
        text = httpx.get(f"{url}/metrics", timeout=30).text
        counts[name] = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total")
        )
    return counts


def test_a_shared_prefix_goes_to_the_replica_that_holds_it(vllm_stack, tenant):
    client = sdk(f"{vllm_stack.gateway_url}/v1", tenant[1])
    for document in range(3):
        prefix = " ".join(f"fact {document}-{i} is true." for i in range(PREFIX_WORDS // 5))
        before = _served(vllm_stack)
        client.completions.create(
            model=DEFAULT_MODEL_ID, prompt=f"{prefix} First question?", max_tokens=2
        )
        first = _served(vllm_stack)
        (holder,) = [name for name in first if first[name] > before[name]]
        follow = client.completions.create(
            model=DEFAULT_MODEL_ID, prompt=f"{prefix} Second question?", max_tokens=2
        )
        after = _served(vllm_stack)
        assert [name for name in after if after[name] > first[name]] == [holder]
        # Served from that replica's cache: the other never saw the prefix.
        assert follow.usage.prompt_tokens_details.cached_tokens >= 16 * (PREFIX_WORDS // 32)
