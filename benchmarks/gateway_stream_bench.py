"""Gateway CPU per streamed token, and what it adds to a one-token request (issue 38).

Real Redis, tokenizer, router and gateway processes in front of stub engines
(tests/integration/gateway/stubs.py): one paced like a real engine (each
token 10-30 ms after the last, uniformly at random), one answering at once.

1. Streams (`one_token_per_message`): 1 / 8 / 32 / 64 clients at once, each
   reading chat streams of `--tokens` tokens in turn over SSE; the gateway
   process's CPU time (user + system, every thread) over the level divided by
   the tokens delivered (the usage chunk's completion_tokens), the SSE chunks
   that carried them, and the gap between chunks with text as the client saw
   it (the inter-token latency of a reader that keeps up; the engine's own
   pace is 10-30 ms).
2. Tokens ready together: the same at 32 streams from an engine that makes
   four tokens at a time (a pause of 40-120 ms, then four: the same rate),
   sent as four messages back to back, or as one (what the engine's servicer
   sends for tokens ready together).
3. One-token requests: the client's latency through the gateway minus the
   same request sent straight to the stub engine's Generate, p50 and p99.

The gateway gets a core of its own (gateway_bench.start_stack pins it), so
its CPU time is its own whatever else the machine runs. Run by
`make bench-gateway`; JSON into benchmarks/results/gateway_stream.json.
"""

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.gateway_bench import (
    MESSAGES,
    Processes,
    added,
    cpu_seconds,
    direct,
    ms,
    pct,
    start_stack,
    tenant_key,
    through_gateway,
)
from benchmarks.machine import machine
from benchmarks.results_file import report

# Sequential streams per client at each level: about the same wall time per level.
ROUNDS = {1: 4, 8: 2, 32: 1, 64: 1}


async def one_stream(client: httpx.AsyncClient, tokens: int) -> tuple[int, int, list[float]]:
    """(tokens delivered, chunks with text, gaps between those chunks) of one stream."""
    body = {
        "model": "stub-paced",
        "messages": MESSAGES,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    delivered, arrivals = 0, []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                delivered = chunk["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in chunk["choices"]):
                arrivals.append(time.perf_counter())
    return delivered, len(arrivals), [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]


async def level(stack: dict, key: str, streams: int, tokens: int, rounds: int) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(
        base_url=stack["url"], headers=headers, timeout=120, limits=limits
    ) as client:

        async def reader() -> list[tuple[int, int, list[float]]]:
            return [await one_stream(client, tokens) for _ in range(rounds)]

        cpu_before, started = cpu_seconds(stack["gateway_pid"]), time.perf_counter()
        results = [
            r for rs in await asyncio.gather(*(reader() for _ in range(streams))) for r in rs
        ]
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(stack["gateway_pid"]) - cpu_before
    delivered = sum(r[0] for r in results)
    chunks = sum(r[1] for r in results)
    gaps = [gap for r in results for gap in r[2]]
    return {
        "streams": streams,
        "requests": len(results),
        "tokens_delivered": delivered,
        "text_chunks": chunks,
        "gateway_cpu_ms_per_token": round(cpu * 1000 / delivered, 4),
        "gateway_cpu_share": round(cpu / elapsed, 3),
        "tokens_per_second": round(delivered / elapsed, 1),
        "chunk_gap_p50_ms": ms(pct(gaps, 50)),
        "chunk_gap_p99_ms": ms(pct(gaps, 99)),
    }


@dataclass(frozen=True)
class Engine:
    """How the paced stub sends its tokens: `burst` tokens after each pause of
    burst x 10-30 ms (the same rate), as one message each or one message for
    all; each request on a clock of its own or all on one (`stepped`)."""

    name: str
    burst: int = 1
    merged: bool = False
    stepped: bool = False

    def args(self, per_call: bool) -> tuple[str, ...]:
        return (
            *("--burst", str(self.burst)),
            *(("--merged",) if self.merged else ()),
            *(("--stepped",) if self.stepped else ()),
            *(("--no-generate-many",) if per_call else ()),
        )


# A token each per message: every level; several ready together: --burst-levels.
ENGINES = {
    # Each request paced by a clock of its own: no two requests' tokens are
    # ready together, the worst case for the engine's GenerateMany stream.
    "one_token_per_message": Engine("one_token_per_message"),
    # Every request paced by one clock, a token each per pause: a real
    # engine's model steps, whose tokens share the stream's messages.
    "one_token_per_step": Engine("one_token_per_step", stepped=True),
    # Four tokens ready together (a step of speculative decoding, a serving
    # process behind its core): as four messages (what an engine that merges
    # nothing sends) and as one (the engine servicer's coalescing).
    "four_ready_four_messages": Engine("four_ready_four_messages", 4),
    "four_ready_one_message": Engine("four_ready_one_message", 4, merged=True),
}


async def streams(args, engine: Engine, levels: list[int], one_token: bool) -> dict:
    with tempfile.TemporaryDirectory() as state:
        procs = Processes(Path(state))
        try:
            pace = (0.01 * engine.burst, 0.03 * engine.burst)
            stack = await start_stack(procs, args.tokens, pace, engine.args(args.per_call))
            key = await tenant_key(
                stack["redis_url"], "bench", rpm=10**9, tpm=10**12, max_concurrency=10**4
            )
            await level(stack, key, 8, args.tokens, 1)  # warm up
            result = {
                "levels": [
                    await level(stack, key, streams, args.tokens, ROUNDS.get(streams, 1))
                    for streams in levels
                ]
            }
            if one_token:
                result["one_token_added_ms"] = await one_token_requests(stack, key, args.runs)
        finally:
            procs.stop()
    return result


async def one_token_requests(stack: dict, key: str, runs: int) -> dict:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=stack["url"], headers=headers) as client:
        await through_gateway(client, 20, 1, "stub-fast")  # warm up
        cpu_before = cpu_seconds(stack["gateway_pid"])
        gw_first, gw_total, _ = await through_gateway(client, runs, 1, "stub-fast")
        request_cpu = (cpu_seconds(stack["gateway_pid"]) - cpu_before) / runs
    await direct(stack, 20, 1)
    d_first, d_total = await direct(stack, runs, 1)
    return {
        **added((gw_first, gw_total), (d_first, d_total)),
        "gateway_cpu_ms_each": ms(request_cpu),
        "runs": runs,
    }


async def run(args) -> dict:
    results = {
        "machine": machine(),
        "label": args.label,
        "engine_pace_ms_per_token": [10, 30],
        "tokens_per_stream": args.tokens,
        "engine_calls": "one Generate call per request" if args.per_call else "GenerateMany",
    }
    for name in args.engines:
        levels = args.burst_levels if ENGINES[name].burst > 1 else args.levels
        results[name] = await streams(args, ENGINES[name], levels, name == "one_token_per_message")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--burst-levels", type=int, nargs="+", default=[32])
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--runs", type=int, default=200, help="one-token requests")
    parser.add_argument(
        "--per-call",
        action="store_true",
        help="stub engines without GenerateMany: one gRPC call per request (the A/B's before)",
    )
    parser.add_argument("--label", default="", help="what was measured (a commit, a change)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    report(results, args.output)


if __name__ == "__main__":
    main()
