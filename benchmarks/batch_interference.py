"""An interactive tenant's latency with and without a batch running beside it.

Starts the stack as `maas up` does (the real SmolLM2 engine), then measures one
interactive tenant sending chat completions one after another (closed loop):
alone, and while another tenant's batch runs (its lines admitted only into
capacity the interactive tenant leaves idle, at the lowest engine priority:
services/gateway/batches/idle_capacity.py, batch_run.py), in alternating
rounds so a shared machine's drift falls on both alike. The figure is the p50
beside the batch over the p50 alone; the target is at most +20%. The batch's
lines completed meanwhile show it ran, not only waited.

Run: .venv/bin/python -m benchmarks.batch_interference
     [--output benchmarks/results/batch_interference.json]
"""

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import openai

from benchmarks.machine import machine
from benchmarks.results_file import report
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import TenantStore
from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one sentence.",
    "List three uses of Python.",
]


def chat(prompt: str, max_tokens: int) -> dict:
    return {
        "model": DEFAULT_MODEL_ID,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


async def interactive(client: openai.AsyncOpenAI, requests: int, max_tokens: int) -> list[float]:
    latencies = []
    for n in range(requests):
        body = chat(PROMPTS[n % len(PROMPTS)], max_tokens)
        started = time.perf_counter()
        extra = {"ignore_eos": body.pop("ignore_eos")}
        await client.chat.completions.create(**body, extra_body=extra)
        latencies.append(time.perf_counter() - started)
    return latencies


def summary(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "p50_s": round(statistics.median(ordered), 4),
        "p90_s": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
        "mean_s": round(statistics.fmean(ordered), 4),
    }


async def batch_tenant_key(redis_url: str) -> str:
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        name = f"batch-{uuid.uuid4().hex[:8]}"
        await store.create_tenant(name)
        return (await store.create_key(name))[1]
    finally:
        await redis.aclose()


async def beside_a_batch(
    client: openai.AsyncOpenAI, batcher: openai.AsyncOpenAI, file_id: str, args
) -> tuple[list[float], int, float]:
    """The interactive requests while a fresh batch runs, the batch's lines completed
    meanwhile and the seconds; the batch is cancelled after (its lines end)."""
    batch = await batcher.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # Until its lines are running.
    while (await batcher.batches.retrieve(batch.id)).request_counts.completed == 0:
        await asyncio.sleep(0.1)
    before = (await batcher.batches.retrieve(batch.id)).request_counts.completed
    started = time.perf_counter()
    latencies = await interactive(client, args.requests, args.max_tokens)
    window = time.perf_counter() - started
    during = (await batcher.batches.retrieve(batch.id)).request_counts.completed - before
    await batcher.batches.cancel(batch.id)
    while (await batcher.batches.retrieve(batch.id)).status != "cancelled":
        await asyncio.sleep(0.2)
    return latencies, during, window


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as state:
        os.environ["MAAS_FILES_DIR"] = str(Path(state) / "files")
        os.environ["MAAS_BATCH_CONCURRENCY"] = str(args.batch_concurrency)
        os.environ["MAAS_BATCH_POLL_SECONDS"] = "0.2"
        stack = Stack(StackConfig(state_dir=Path(state), gateway_port=free_port()))
        alone, beside, completed, seconds = [], [], 0, 0.0
        try:
            await stack.start()
            base = f"{stack.gateway_url}/v1"
            client = openai.AsyncOpenAI(base_url=base, api_key=stack.api_key, max_retries=0)
            batcher = openai.AsyncOpenAI(
                base_url=base, api_key=await batch_tenant_key(stack.redis_url), max_retries=0
            )
            lines = "".join(
                json.dumps(
                    {
                        "custom_id": f"line-{n}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": chat(f"{PROMPTS[n % len(PROMPTS)]} ({n})", args.batch_tokens),
                    }
                )
                + "\n"
                for n in range(args.batch_lines)
            )
            file = await batcher.files.create(
                file=("batch.jsonl", io.BytesIO(lines.encode())), purpose="batch"
            )
            await interactive(client, 4, args.max_tokens)  # warm up
            # Rounds of alone, then beside a batch: a shared machine's drift
            # falls on both alike.
            for _ in range(args.rounds):
                alone += await interactive(client, args.requests, args.max_tokens)
                latencies, during, window = await beside_a_batch(client, batcher, file.id, args)
                beside += latencies
                completed += during
                seconds += window
        finally:
            stack.stop()
    increase = statistics.median(beside) / statistics.median(alone) - 1
    return {
        "benchmark": "batch_interference",
        "command": "python -m benchmarks.batch_interference " + " ".join(args.argv),
        "machine": machine(),
        "settings": {
            "rounds": args.rounds,
            "interactive_requests_per_round": args.requests,
            "interactive_max_tokens": args.max_tokens,
            "batch_lines": args.batch_lines,
            "batch_max_tokens": args.batch_tokens,
            "batch_concurrency_per_gateway": args.batch_concurrency,
        },
        "interactive_alone": summary(alone),
        "interactive_beside_batch": summary(beside),
        "batch_lines_completed_beside": completed,
        "batch_lines_per_second_beside": round(completed / seconds, 3),
        "p50_increase": round(increase, 4),
        "target_p50_increase": 0.2,
        "target_met": increase <= 0.2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch-lines", type=int, default=400)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--batch-concurrency", type=int, default=4)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    report(asyncio.run(run(args)), args.output)


if __name__ == "__main__":
    main()
