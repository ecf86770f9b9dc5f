"""Old gateway against new, same stack, same load: `python -m benchmarks.gateway_ab --base REV`.

CPU per request moves with the machine's load (12-18 ms per stream for the
same code at load 5-10), so a cut is measured A/B: the bench stack
(gateway_bench.start_stack) with a second gateway run from a git revision's
tree, both pinned to core 0, alternating rounds of admitted streamed chats;
each round's gateway CPU per request and median time to first token (a
round trip saved shows there, not only in CPU), and the medians.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

from benchmarks.base_gateway import export, start_base_gateway
from benchmarks.gateway_bench import (
    Processes,
    cpu_seconds,
    start_stack,
    tenant_key,
    through_gateway,
)
from benchmarks.machine import load_average_1m
from benchmarks.order import in_turn


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as state:
        state = Path(state)
        base = export(args.base, state)
        procs = Processes(state)
        try:
            stack = await start_stack(procs, args.tokens)
            url, pid = await start_base_gateway(procs, stack, base)
            key = await tenant_key(
                stack["redis_url"], "ab", rpm=10**9, tpm=10**12, max_concurrency=10**4
            )
            headers = {"Authorization": f"Bearer {key}"}
            sides = {"new": (stack["url"], stack["gateway_pid"]), "base": (url, pid)}
            cpu = {name: [] for name in sides}
            ttft = {name: [] for name in sides}
            for turn in range(args.rounds + 1):
                for name in in_turn(sides, turn):
                    address, pid = sides[name]
                    async with httpx.AsyncClient(base_url=address, headers=headers) as client:
                        if turn == 0:  # warm-up
                            await through_gateway(client, 20, args.tokens, "stub-fast")
                            continue
                        before = cpu_seconds(pid)
                        firsts, _, _ = await through_gateway(
                            client, args.runs, args.tokens, "stub-fast"
                        )
                        ttft[name].append(statistics.median(firsts) * 1000)
                        cpu[name].append((cpu_seconds(pid) - before) * 1000 / args.runs)
        finally:
            procs.stop()
    return {
        "base": args.base,
        "load_average_1m": load_average_1m(),
        "runs_per_round": args.runs,
        "tokens": args.tokens,
        **{f"{name}_cpu_ms_median": round(statistics.median(v), 2) for name, v in cpu.items()},
        **{f"{name}_cpu_ms_rounds": [round(x, 2) for x in v] for name, v in cpu.items()},
        **{f"{name}_ttft_ms_median": round(statistics.median(v), 2) for name, v in ttft.items()},
        **{f"{name}_ttft_ms_rounds": [round(x, 2) for x in v] for name, v in ttft.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the old gateway")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=80, help="streams per round")
    parser.add_argument("--tokens", type=int, default=16)
    json.dump(asyncio.run(run(parser.parse_args())), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
