"""Old gateway against new on paced streams, same stack, same load:
`python -m benchmarks.gateway_stream_ab --base REV` (or `--base-tree DIR`, a copy
of the source folders taken before a change: one cut at a time in a working tree).

Gateway CPU per streamed token moves with the machine's load (the same code
measured 0.19 and 0.25 ms at 32 streams, loads 16 and 21), so a change is
measured A/B: gateway_bench.start_stack with a second gateway run from a git
revision's tree, both pinned to core 0, alternating rounds of `--streams`
paced chat streams (gateway_stream_bench.level); each round's CPU per token,
and the medians.

The old gateway: base_gateway.py.
"""

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from benchmarks.base_gateway import export, start_base_gateway
from benchmarks.gateway_bench import Processes, start_stack, tenant_key
from benchmarks.gateway_stream_bench import ENGINES, level
from benchmarks.machine import machine
from benchmarks.order import in_turn
from benchmarks.results_file import report


async def run(args) -> dict:
    engine = ENGINES[args.engine]
    with tempfile.TemporaryDirectory() as state:
        state = Path(state)
        tree = Path(args.base_tree).resolve() if args.base_tree else export(args.base, state)
        procs = Processes(state)
        try:
            pace = (0.01 * engine.burst, 0.03 * engine.burst)
            stack = await start_stack(procs, args.tokens, pace, engine.args(per_call=False))
            url, pid = await start_base_gateway(procs, stack, tree)
            key = await tenant_key(
                stack["redis_url"], "ab", rpm=10**9, tpm=10**12, max_concurrency=10**4
            )
            sides = {"new": stack, "base": {**stack, "url": url, "gateway_pid": pid}}
            cpu: dict[str, list[float]] = {name: [] for name in sides}
            for turn in range(args.rounds + 1):
                for name in in_turn(sides, turn):
                    result = await level(sides[name], key, args.streams, args.tokens, 1)
                    if turn:  # the first turn warms both up
                        cpu[name].append(result["gateway_cpu_ms_per_token"])
        finally:
            procs.stop()
    return {
        "machine": machine(),
        "base": args.base_tree or args.base,
        "label": args.label,
        "engine": args.engine,
        "streams": args.streams,
        "tokens_per_stream": args.tokens,
        **{f"{name}_cpu_ms_per_token_median": statistics.median(v) for name, v in cpu.items()},
        **{f"{name}_cpu_ms_per_token_rounds": v for name, v in cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the old gateway")
    parser.add_argument("--base-tree", help="the old gateway's source folders instead (PACKAGES)")
    parser.add_argument("--label", default="", help="the change measured")
    parser.add_argument("--engine", choices=list(ENGINES), default="one_token_per_message")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    report(results, args.output)


if __name__ == "__main__":
    main()
