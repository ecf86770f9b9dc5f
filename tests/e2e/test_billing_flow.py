"""Tokens served through the gateway arrive in billing's counters, exactly."""

import asyncio
import csv
import io
import json
import subprocess
import sys

import openai
import pytest

from maas.v1 import billing_pb2, billing_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_services.common.model_files import DEFAULT_MODEL_ID
from tests.e2e.tenants import new_tenant_key

pytestmark = pytest.mark.slow


async def test_usage_reaches_billing_exactly(stack):
    tenant, key = await new_tenant_key(stack.redis_url)
    client = openai.AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key=key, max_retries=0)
    prompt_total = completion_total = 0
    for question, max_tokens in [("Hi", 5), ("Name a fruit.", 7), ("Count to three.", 9)]:
        reply = await client.chat.completions.create(
            model=DEFAULT_MODEL_ID,
            messages=[{"role": "user", "content": question}],
            max_tokens=max_tokens,
            temperature=0,
        )
        prompt_total += reply.usage.prompt_tokens
        completion_total += reply.usage.completion_tokens
    # A stream the client stops reading is still billed for what was generated.
    stream = await client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=200,
        temperature=0,
        stream=True,
    )
    async for _chunk in stream:
        break
    await stream.close()

    async with open_channel(stack.addresses["billing"], "test", stack.service_token) as channel:
        stub = billing_pb2_grpc.BillingStub(channel)
        for _ in range(100):
            usage = await stub.GetUsage(billing_pb2.GetUsageRequest(tenant=tenant))
            if usage.requests == 4:
                break
            await asyncio.sleep(0.1)
    assert usage.requests == 4
    aborted_completion = usage.completion_tokens - completion_total
    assert 1 <= aborted_completion < 200
    assert usage.prompt_tokens > prompt_total
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert [m.model for m in usage.models] == [DEFAULT_MODEL_ID]


def maas(*argv: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "maas_tools.cli", *argv], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_cli_usage_equals_what_responses_reported(stack):
    tenant, key = await new_tenant_key(stack.redis_url)
    client = openai.AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key=key, max_retries=0)
    reported = 0
    for max_tokens in (3, 6):
        reply = await client.completions.create(
            model=DEFAULT_MODEL_ID, prompt="Once upon a time", max_tokens=max_tokens
        )
        reported += reply.usage.total_tokens
    state = ["--state-dir", str(stack.config.state_dir)]
    for _ in range(100):
        report = json.loads(maas("billing", *state, "usage", "--tenant", tenant))
        if report["requests"] == 2:
            break
        await asyncio.sleep(0.1)
    assert report["total_tokens"] == reported
    assert report["prompt_tokens"] + report["completion_tokens"] == reported
    rows = list(
        csv.DictReader(
            io.StringIO(maas("billing", *state, "usage", "--tenant", tenant, "--format", "csv"))
        )
    )
    assert [(r["model"], int(r["total_tokens"])) for r in rows] == [(DEFAULT_MODEL_ID, reported)]
    reconcile = json.loads(maas("billing", *state, "reconcile"))
    # Billing never charges a token the engines did not generate.
    assert reconcile["engines"]["completion_tokens"] >= reconcile["ledger"]["completion_tokens"]
    assert reconcile["ledger"]["completion_tokens"] >= report["completion_tokens"]
