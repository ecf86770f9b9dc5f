"""What the largest embeddings request costs another tenant (issue 33 item 2).

Starts the local stack as `maas up` does (maas_tools.bench.local_stack: one
native engine on SmolLM2), creates two tenants, and measures from outside:

- victim: `--requests` chat completions one after another (a short user
  message of distinct words, max_tokens `--victim-max-tokens`, greedy):
  latency p50/p95 alone, then while the embedder's request runs;
- embedder: one POST /v1/embeddings of `--inputs` inputs (2048 is OpenAI's
  most) of `--chars` characters each, distinct words so no prefix is shared;
  its status, wall time, inputs and prompt tokens per second.

The gateway admits each input as its own request through the tenant's fair
queue, at most `max_concurrency` (`--embedder-concurrency`; unset, 8) at once for one request
(services/common/openai_api/embeddings.py), so the victim should wait
for at most the embeddings already in the engine's batch, not for the list.

Smoke run: `python -m benchmarks.embeddings_isolation_bench --inputs 64 --requests 5`.
"""

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import httpx

from benchmarks.isolation_bench import tenant_keys
from benchmarks.machine import machine
from benchmarks.results_file import report
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.bench.local_stack import local_stack
from maas_tools.bench.stats import distribution
from maas_tools.bench.text import words

LIMITS = {"rpm": 10**6, "tpm": 10**9}


async def create_keys(redis_url: str, embedder_concurrency: int) -> dict[str, str]:
    return await tenant_keys(
        redis_url,
        {"victim": LIMITS, "embedder": {**LIMITS, "max_concurrency": embedder_concurrency}},
    )


async def victim_latencies(
    client: httpx.AsyncClient, key: str, count: int, args, seed: int
) -> tuple[list[float], list[int]]:
    rng = random.Random(seed)
    seconds, statuses = [], []
    for _ in range(count):
        body = {
            "model": DEFAULT_MODEL_ID,
            "messages": [{"role": "user", "content": words(rng, 12)}],
            "max_tokens": args.victim_max_tokens,
            "temperature": 0,
        }
        started = time.perf_counter()
        response = await client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        seconds.append(time.perf_counter() - started)
        statuses.append(response.status_code)
    return seconds, statuses


async def embed(client: httpx.AsyncClient, key: str, args) -> dict:
    rng = random.Random(7)
    inputs = [words(rng, args.chars // 3)[: args.chars] for _ in range(args.inputs)]
    started = time.perf_counter()
    response = await client.post(
        "/v1/embeddings",
        json={"model": DEFAULT_MODEL_ID, "input": inputs},
        headers={"Authorization": f"Bearer {key}"},
    )
    wall = time.perf_counter() - started
    tokens = response.json()["usage"]["prompt_tokens"] if response.status_code == 200 else 0
    return {
        "status": response.status_code,
        "wall_s": round(wall, 2),
        "prompt_tokens": tokens,
        "inputs_per_s": round(args.inputs / wall, 1),
        "prompt_tokens_per_s": round(tokens / wall, 1),
    }


async def run(args) -> dict:
    async with local_stack("prefix_affinity", 1, args.engine_args, label="embeddings") as stack:
        keys = await create_keys(stack.redis_url, args.embedder_concurrency)
        timeout = httpx.Timeout(args.timeout, connect=10.0)
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=timeout) as client:
            await victim_latencies(client, keys["victim"], 2, args, seed=99)  # warm up
            alone, alone_statuses = await victim_latencies(
                client, keys["victim"], args.requests, args, seed=0
            )
            embedding = asyncio.create_task(embed(client, keys["embedder"], args))
            await asyncio.sleep(args.head_start)
            during, during_statuses = await victim_latencies(
                client, keys["victim"], args.requests, args, seed=1
            )
            finished_first = not embedding.done()
            embedder = await embedding
    alone_p50 = distribution(alone)["p50"]
    during_p50 = distribution(during)["p50"]
    return {
        "benchmark": "embeddings_isolation",
        "machine": {key: value for key, value in machine().items() if key != "flags"},
        "command": "python -m benchmarks.embeddings_isolation_bench " + " ".join(sys.argv[1:]),
        "inputs": args.inputs,
        "chars_per_input": args.chars,
        "embedder_concurrency": args.embedder_concurrency,
        "victim": {
            "requests": args.requests,
            "max_tokens": args.victim_max_tokens,
            "alone_s": distribution(alone),
            "during_embeddings_s": distribution(during),
            "p50_ratio": round(during_p50 / alone_p50, 2),
            "statuses": sorted(set(alone_statuses + during_statuses)),
            # Every victim request answered while the embeddings request still ran.
            "served_while_embedding": finished_first,
        },
        "embedder": embedder,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=2048)
    parser.add_argument("--chars", type=int, default=1500)
    parser.add_argument(
        "--embedder-concurrency",
        type=int,
        default=0,
        help="the embedder key's max_concurrency: its inputs in flight (0: the gateway's default)",
    )
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--victim-max-tokens", type=int, default=8)
    parser.add_argument("--head-start", type=float, default=2.0, help="seconds of embeddings first")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--engine-args", nargs="*", default=[])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    report(asyncio.run(run(args)), args.output)


if __name__ == "__main__":
    main()
