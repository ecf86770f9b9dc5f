"""Local-mode smoke benchmark: time to ready, latency through the gateway, memory.

Starts the stack exactly as `maas up` does, streams a few chat completions
through the gateway one at a time, and writes JSON. Run: `make bench`.
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import openai

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one paragraph.",
    "List three uses of Python.",
]


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the process's peak resident set, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def stream_one(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> dict:
    started = time.perf_counter()
    arrivals = []
    stream = await client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {
        "ttft_s": arrivals[0] - started,
        "itl_mean_s": statistics.fmean(gaps) if gaps else 0.0,
        "completion_tokens": tokens,
        "e2e_s": time.perf_counter() - started,
    }


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as state:
        config = StackConfig(
            state_dir=Path(state), gateway_port=free_port(), engine_args=args.engine_args
        )
        stack = Stack(config)
        started = time.perf_counter()
        try:
            await stack.start()
            ready_s = time.perf_counter() - started
            client = openai.AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key)
            await stream_one(client, "warm up", 4)
            runs = [await stream_one(client, p, args.max_tokens) for p in PROMPTS]
            peaks = {p.name: round(peak_rss_mib(p.pid), 1) for p in stack.processes}
        finally:
            stack.stop()
    tokens = sum(r["completion_tokens"] for r in runs)
    return {
        "benchmark": "stack_smoke",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "engine_args": args.engine_args,
        "time_to_ready_s": round(ready_s, 2),
        "requests": len(runs),
        "ttft_mean_s": round(statistics.fmean(r["ttft_s"] for r in runs), 4),
        "itl_mean_s": round(statistics.fmean(r["itl_mean_s"] for r in runs), 4),
        "single_stream_tokens_per_s": round(tokens / sum(r["e2e_s"] for r in runs), 2),
        "peak_rss_mib": peaks,
        "peak_rss_sum_mib": round(sum(peaks.values()), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/stack_smoke.json"))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--engine-args", nargs="*", default=[])
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
