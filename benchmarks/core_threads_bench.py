"""The engine core's threads and OpenMP wait policy, A/B: `python -m benchmarks.core_threads_bench`.

Each variant is `maas serve engine` started alone with its environment and
flags, driven over gRPC Generate (greedy, ignore_eos, float32) at 1 and 8
streams (--levels); the variants rotate round by round so a changing machine
load falls on all of them. --variant NAME=FLAGS adds one of engine flags,
e.g. the per-step threads: `--variant 'wide16=--torch-threads 2
--compute-wide-rows 16'`. Output tokens/s, CPU ms per token of the core and of
the serving process (from /proc), and the load average, per variant and
round, into benchmarks/results/core_threads.json. The numbers behind the
core's thread default are in docs/engine.md.
"""

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from benchmarks.machine import machine
from benchmarks.results_file import update_results
from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_tools.local.ports import free_port

TOPICS = ["rivers", "volcanoes", "bread", "chess", "jazz", "bees", "glaciers", "trains"]
# Two threads in every step, as before the per-step threads (core/compute_threads.py).
TWO = ["--torch-threads", "2", "--compute-wide-rows", "1"]
# name: (OpenMP environment, engine flags)
VARIANTS = {
    "auto": ({}, []),
    "1-thread": ({"OMP_WAIT_POLICY": "PASSIVE"}, ["--torch-threads", "1"]),
    "2-passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, TWO),
    "2-spin10k": ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}, TWO),
    "2-spin100k": ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "100000"}, TWO),
    "2-gomp-default": ({"GOMP_SPINCOUNT": "300000"}, TWO),
    "2-active": ({"OMP_WAIT_POLICY": "ACTIVE"}, TWO),
}
OMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_of(pid: int) -> int:
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        if children:
            return int(children[0])
    raise RuntimeError(f"process {pid} has no engine core")


async def generate(stub, request_id: str, prompt: list[int], tokens: int) -> int:
    request = engine_pb2.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=engine_pb2.SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0),
    )
    return sum([len(reply.token_ids) async for reply in stub.Generate(request)])


async def drive(address: str, serving: int, prompts, levels: dict[int, int]) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        deadline = time.monotonic() + 600
        while True:
            try:
                await generate(stub, "warm-up", prompts[0], 16)
                break
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)
        core = child_of(serving)
        results = {}
        for streams, tokens in levels.items():
            core_cpu, serving_cpu, load = cpu_seconds(core), cpu_seconds(serving), os.getloadavg()
            started = time.perf_counter()
            counts = await asyncio.gather(
                *(
                    generate(stub, f"{streams}-{i}-{started}", prompts[i % len(prompts)], tokens)
                    for i in range(streams)
                )
            )
            wall, total = time.perf_counter() - started, sum(counts)
            results[str(streams)] = {
                "tokens_per_s": round(total / wall, 2),
                "core_cpu_ms_per_token": round(1000 * (cpu_seconds(core) - core_cpu) / total, 1),
                "serving_cpu_ms_per_token": round(
                    1000 * (cpu_seconds(serving) - serving_cpu) / total, 2
                ),
                "load_average_1m": round(load[0], 2),
            }
    return results


def run_variant(
    variant: tuple[dict, list[str]], prompts, levels: dict[int, int], autogroup_nice: int | None
) -> dict:
    omp, flags = variant
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARIABLES} | omp
    port = free_port()
    argv = [sys.executable, "-m", "maas_tools.cli", "serve", "engine", "--port", str(port)]
    argv += ["--dtype", "float32", "--log-level", "warning", *flags]
    engine = subprocess.Popen(
        argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        if autogroup_nice is not None:
            # Linux shares the CPU between sessions (autogroups) whatever a process's nice.
            Path(f"/proc/{engine.pid}/autogroup").write_text(str(autogroup_nice))
        return asyncio.run(drive(f"127.0.0.1:{port}", engine.pid, prompts, levels))
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="auto,2-passive,2-spin100k,2-active")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens-1", type=int, default=128, help="output tokens at 1 stream")
    parser.add_argument(
        "--tokens-8", type=int, default=64, help="output tokens per stream above 1 stream"
    )
    parser.add_argument("--levels", default="1,8", help="streams, comma-separated")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a variant of engine flags (OpenMP PASSIVE), repeatable; list it in --variants",
    )
    parser.add_argument(
        "--autogroup-nice",
        type=int,
        help="on a shared machine: the engines' session nice (-10 lifts them over the others)",
    )
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/core_threads.json"))
    args = parser.parse_args()
    names = args.variants.split(",")
    variants = dict(VARIANTS)
    for spec in args.variant:
        name, _, flags = spec.partition("=")
        variants[name] = ({"OMP_WAIT_POLICY": "PASSIVE"}, flags.split())
    tokenizer = load_tokenizer(default_model_path())
    prompts = [
        tokenizer.encode_chat([{"role": "user", "content": f"Tell me a long story about {t}."}])
        for t in TOPICS
    ]
    levels = {
        n: args.tokens_1 if n == 1 else args.tokens_8 for n in map(int, args.levels.split(","))
    }
    rows = []
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            row = {"round": round_, "variant": name, "flags": variants[name][1]}
            row |= run_variant(variants[name], prompts, levels, args.autogroup_nice)
            print(row, flush=True)
            rows.append(row)
    command = "python -m benchmarks.core_threads_bench " + shlex.join(sys.argv[1:])
    update_results(
        args.output, "core_threads", {"command": command, "machine": machine(), "rows": rows}
    )


if __name__ == "__main__":
    main()
