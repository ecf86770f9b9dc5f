"""Old tokenizer and router against new, same stub engines, same load:
`python -m benchmarks.peer_calls_ab --base REV`.

The two peer calls on every request's path before its first token,
RenderChat and Pick, called the way the gateway calls
them (gateway_bench.steps), against a tokenizer and a router run from a git
revision's tree and the same two run from the working tree, all four pinned
to one core and the client on the other. Rounds alternate between the sides
(the order swapped each round); each round's median client latency and each
server's CPU per call (/proc, the whole process), and the medians over rounds.
"""

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.base_gateway import export
from benchmarks.gateway_bench import RENDER, Processes, cpu_seconds, pin, prompt_ids, start_stack
from benchmarks.machine import load_average_1m
from benchmarks.order import in_turn
from maas.v1 import router_pb2, router_pb2_grpc, tokenizer_pb2_grpc
from maas_services.common.grpc_client import open_channel
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready


class Side:
    """One tokenizer and one router, their stubs, and what a round of each costs."""

    def __init__(self, tokenizer: ManagedProcess, router: ManagedProcess, addresses: dict):
        self.pids = {"render": tokenizer.pid, "pick": router.pid}
        self._channels = [open_channel(addresses[name], "bench") for name in ("tok", "router")]
        self.tokenizer = tokenizer_pb2_grpc.TokenizerStub(self._channels[0])
        self.router = router_pb2_grpc.RouterStub(self._channels[1])
        self.latency: dict[str, list[float]] = {"render": [], "pick": []}
        self.cpu: dict[str, list[float]] = {"render": [], "pick": []}

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


def start_side(procs: Processes, name: str, tree: Path | None, engines: list[str]):
    """A tokenizer and a router from `tree` (None: this checkout)."""
    addresses = {"tok": f"127.0.0.1:{free_port()}", "router": f"127.0.0.1:{free_port()}"}
    env = {"PYTHONPATH": f"{tree}:{tree / 'proto'}"} if tree else None
    started = []
    for service, flags in (
        ("tokenizer", {"port": addresses["tok"].split(":")[1]}),
        ("router", {"port": addresses["router"].split(":")[1], "engines": engines}),
    ):
        argv = serve_argv(service, {**flags, "log-level": "warning"})
        if tree:
            # -P: no working directory first on sys.path, so PYTHONPATH's tree is imported.
            argv.insert(1, "-P")
        process = ManagedProcess(
            f"{name}-{service}", argv, procs.state / "logs" / f"{name}-{service}.log", env=env or {}
        )
        process.start()
        procs.running.append(process)
        started.append(process)
    return started, addresses


async def one_round(side: Side, ids: list[int], runs: int, turn: int) -> None:
    async def render(i: int) -> None:
        await side.tokenizer.RenderChat(RENDER)

    async def pick(i: int) -> None:
        await side.router.Pick(
            router_pb2.PickRequest(
                request_id=f"ab-{turn}-{i}", model="stub-fast", token_ids=ids, tenant="ab"
            )
        )

    for step, call in (("render", render), ("pick", pick)):
        seconds = []
        before = cpu_seconds(side.pids[step])
        for i in range(runs):
            started = time.perf_counter()
            await call(i)
            seconds.append(time.perf_counter() - started)
        side.cpu[step].append((cpu_seconds(side.pids[step]) - before) * 1000 / runs)
        side.latency[step].append(statistics.median(seconds) * 1000)


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as state:
        procs = Processes(Path(state))
        base = export(args.base, procs.state)
        sides: dict[str, Side] = {}
        try:
            stack = await start_stack(procs, 16)
            engines = [f"fast={stack['fast']}", f"paced={stack['paced']}"]
            for name, tree in (("base", base), ("new", None)):
                (tokenizer, router), addresses = start_side(procs, name, tree, engines)
                await wait_ready(tokenizer, addresses["tok"], 120)
                await wait_ready(router, addresses["router"], 60)
                sides[name] = Side(tokenizer, router, addresses)
            servers = [pid for side in sides.values() for pid in side.pids.values()]
            for pid in servers:
                pin(pid, {0})
            others = set(range(1, os.cpu_count())) or {0}
            for process in procs.running:
                if process.pid not in servers:
                    pin(process.pid, others)
            os.sched_setaffinity(0, others)
            ids = await prompt_ids(stack)
            for turn in range(args.rounds + 1):
                for name in in_turn(sides, turn):
                    await one_round(sides[name], ids, 30 if turn == 0 else args.runs, turn)
                    if turn == 0:  # warm-up
                        for values in (*sides[name].latency.values(), *sides[name].cpu.values()):
                            values.clear()
        finally:
            for side in sides.values():
                await side.close()
            procs.stop()
    result: dict = {
        "base": args.base,
        "load_average_1m": load_average_1m(),
        "rounds": args.rounds,
        "runs_per_round": args.runs,
    }
    for name, side in sides.items():
        for step in ("render", "pick"):
            result[f"{name}_{step}_ms_median"] = round(statistics.median(side.latency[step]), 3)
            result[f"{name}_{step}_cpu_ms_median"] = round(statistics.median(side.cpu[step]), 3)
            result[f"{name}_{step}_cpu_ms_rounds"] = [round(x, 3) for x in side.cpu[step]]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the old servers")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=300, help="calls of each kind per round")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
