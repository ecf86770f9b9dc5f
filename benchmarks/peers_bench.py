"""maas against the servers a user would run instead: `make bench-peers`.

One client (maas bench's own, maas_tools.bench.client), one seeded workload
(story prompts, streaming /v1/completions, `--max-tokens` output tokens with
ignore_eos, greedy unless --sampling says otherwise, N streams in a closed
loop), and each server alone on the machine in turn, started and stopped here
(or, with --interleave, all of them up at once and their rounds alternated):
- maas through the gateway, as `maas up` runs it (each --maas-variant too);
- vLLM's CPU build in its own venv (maas_tools.peers), in float32 and in its
  default bf16 (emulated, and slow, on CPUs without native bf16: measured at
  --bf16-levels only);
- llama.cpp's server on the same GGUF file, one request at a time (measured at
  --llamacpp-levels).
Writes benchmarks/results/peers.json (rows, ratios, targets, the machine's CPU
model, flags and load average) and a PNG beside it.
"""

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import peers_report
from benchmarks.machine import load_average_1m, machine
from benchmarks.order import in_turn
from maas_services.common.machine_profile import machine_profile
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.bench.client import ChatClient, RequestResult
from maas_tools.bench.loops import closed_loop
from maas_tools.bench.runner import state_dir
from maas_tools.bench.stats import summarize
from maas_tools.bench.text import words

SUBJECTS = (
    "a lighthouse keeper",
    "a lost robot",
    "two rival bakers",
    "a dragon who fears heights",
    "a girl who maps rivers",
    "an old train driver",
    "a city of bees",
    "a chess player",
)
PLACES = ("a frozen harbour", "the desert", "a floating market", "the moon", "a quiet village")

# A request's worth of output is what varies between levels; prompts stay short.
STORY_WORDS = 12


def story_prompts(seed: int, level: int, count: int) -> list[str]:
    """The same prompts for every server at a level; no two alike, so no cache serves one whole."""
    rng = random.Random(f"{seed}-{level}")
    return [
        f"Write a long story about {rng.choice(SUBJECTS)} in {rng.choice(PLACES)}, "
        f"using the words {words(rng, STORY_WORDS)}.\n\nOnce upon a time,"
        for _ in range(count)
    ]


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # .../v1
    api_key: str
    model: str
    # Request fields in the server's dialect, given the run's max_tokens.
    extra_body: Callable[[int], dict] = lambda max_tokens: {}


@dataclass(frozen=True)
class Server:
    name: str
    levels: tuple[int, ...]
    # Starts the server and yields where it answers; stops it on exit.
    open: Callable[[], contextlib.AbstractAsyncContextManager[Endpoint]]
    setup: dict


async def run_level(
    client: ChatClient, prompts: list[str], level: int, max_tokens: int
) -> tuple[list[RequestResult], float]:
    """prompts through `level` streams in a closed loop: their results and the wall time."""
    results: list[RequestResult] = []

    async def fire(prompt: str) -> None:
        result = await client.complete(prompt, max_tokens)
        # llama.cpp's server streams no usage: each of its chunks is one token.
        result.completion_tokens = result.completion_tokens or len(result.chunk_times)
        results.append(result)

    started = time.perf_counter()
    await closed_loop(prompts, level, fire)
    return results, time.perf_counter() - started


@dataclass
class Opened:
    """A started server and its client, and what its report entry records of the start."""

    server: Server
    client: ChatClient
    ready_seconds: float
    load_before: float

    def entry(self, levels: dict[str, dict]) -> dict:
        return {
            "setup": self.server.setup,
            "ready_seconds": self.ready_seconds,
            "load_average_1m": {"before": self.load_before, "after": load_average_1m()},
            "levels": levels,
        }


@contextlib.asynccontextmanager
async def opened(server: Server, args) -> AsyncIterator[Opened]:
    """The server started, warmed at its widest level (first-request costs and compiled
    shapes off the clock), then stopped on exit."""
    print(f"--- {server.name}: starting", flush=True)
    started = time.perf_counter()
    load_before = load_average_1m()
    async with server.open() as endpoint:
        ready_s = round(time.perf_counter() - started, 1)
        extra = endpoint.extra_body(args.max_tokens) | args.sampling
        client = ChatClient(
            endpoint.base_url, endpoint.api_key, endpoint.model, args.timeout, extra_body=extra
        )
        try:
            warm = story_prompts(args.seed + 1, 0, max(server.levels))
            await closed_loop(warm, max(server.levels), lambda p: client.complete(p, 4))
            yield Opened(server, client, ready_s, load_before)
        finally:
            await client.close()


# A peer that will not build or start costs its rows, not the others' (a long run).
PEER_FAILURES = (RuntimeError, OSError)


def failed(server: Server, error: Exception) -> dict:
    """The report entry of a server that failed: its setup and why."""
    print(f"--- {server.name} failed: {error}", flush=True)
    return {"setup": server.setup, "error": str(error)}


def level_prompts(args, level: int) -> list[str]:
    return story_prompts(args.seed, level, max(level * args.rounds, args.min_requests))


def reported_row(name: str, level: int, results: list[RequestResult], wall: float, args) -> dict:
    row = peers_report.level_row(summarize(results, wall), args.max_tokens)
    print(
        f"{name} x{level}: {row['output_tokens_per_s']} output tok/s, "
        f"TTFT p50 {row['ttft_ms']['p50']} ms, ITL p50 {row['itl_ms']['p50']} ms, "
        f"errors {row['errors'] or 0}",
        flush=True,
    )
    return row


async def measure_server(server: Server, args) -> dict:
    async with opened(server, args) as server_up:
        levels = {}
        for level in server.levels:
            prompts = level_prompts(args, level)
            results, wall = await run_level(server_up.client, prompts, level, args.max_tokens)
            levels[str(level)] = reported_row(server.name, level, results, wall, args)
    return server_up.entry(levels)


async def measure_interleaved(servers: list[Server], args) -> dict[str, dict]:
    """--interleave: every server up at once (each idle while another is measured), and at
    each level the requests cut into --rounds rounds, each round run on every server in
    turn, the order reversed every other round (A B, B A, A B...). A host whose speed
    drifts over minutes then drifts under every server alike: the ratio, not each rate,
    is the figure. A server's rate is its tokens over the sum of its rounds' walls; one
    that will not start is reported as such, and the others run without it."""
    entries: dict[str, dict] = {}
    async with contextlib.AsyncExitStack() as stack:
        up: list[Opened] = []
        for server in servers:
            try:
                up.append(await stack.enter_async_context(opened(server, args)))
            except PEER_FAILURES as error:
                entries[server.name] = failed(server, error)
        levels: dict[str, dict[str, dict]] = {s.server.name: {} for s in up}
        for level in sorted({level for s in up for level in s.server.levels}):
            taking = [s for s in up if level in s.server.levels]
            prompts = level_prompts(args, level)
            rounds = [prompts[r :: args.rounds] for r in range(args.rounds)]
            results: dict[str, list[RequestResult]] = {s.server.name: [] for s in taking}
            walls = dict.fromkeys(results, 0.0)
            for index, round_prompts in enumerate(rounds):
                for server_up in in_turn(taking, index):
                    name = server_up.server.name
                    got, wall = await run_level(
                        server_up.client, round_prompts, level, args.max_tokens
                    )
                    results[name] += got
                    walls[name] += wall
            for name, got in results.items():
                levels[name][str(level)] = reported_row(name, level, got, walls[name], args)
        entries |= {s.server.name: s.entry(levels[s.server.name]) for s in up}
    return {server.name: entries[server.name] for server in servers}


def maas_server(name: str, flags: list[str], levels: tuple[int, ...]) -> Server:
    @contextlib.asynccontextmanager
    async def open_maas() -> AsyncIterator[Endpoint]:
        from maas_tools.bench.local_stack import local_stack

        async with local_stack("prefix_affinity", 1, flags, f"peers-{name}") as stack:
            yield Endpoint(f"{stack.gateway_url}/v1", stack.api_key, DEFAULT_MODEL_ID)

    return Server(name, levels, open_maas, {"engine_args": flags, "engine_replicas": 1})


def vllm_server(dtype: str, levels: tuple[int, ...], args) -> Server:
    from maas_tools.peers.venv import VLLM, ensure

    def config():
        from maas_tools.peers.model_folder import hf_model_folder
        from maas_tools.peers.vllm_server import VllmConfig

        return VllmConfig(
            python=ensure(VLLM),
            model=hf_model_folder(None),
            served_model_name=DEFAULT_MODEL_ID,
            dtype=dtype,
            enforce_eager=args.vllm_enforce_eager,
            kv_cache_gib=args.vllm_kv_cache_gib,
            cpus=args.vllm_cpus,
        )

    @contextlib.asynccontextmanager
    async def open_vllm() -> AsyncIterator[Endpoint]:
        from maas_tools.peers.vllm_server import VllmServer

        log = state_dir() / "bench" / f"peers-vllm-{dtype}" / "vllm.log"
        server = VllmServer(config(), log)
        await asyncio.to_thread(server.start)
        try:
            yield Endpoint(f"{server.url}/v1", "none", DEFAULT_MODEL_ID)
        finally:
            server.stop()

    setup = {
        "version": VLLM.version,
        "dtype": dtype,
        "enforce_eager": args.vllm_enforce_eager,
        "kv_cache_gib": args.vllm_kv_cache_gib,
        "omp_threads_bind": args.vllm_cpus or "auto",
        "python_override": os.environ.get(VLLM.python_env, ""),
    }
    return Server(f"vllm-{dtype}", levels, open_vllm, setup)


def llamacpp_server(levels: tuple[int, ...], threads: int) -> Server:
    from maas_tools.peers.llamacpp_server import LlamaCppConfig, llamacpp_server
    from maas_tools.peers.venv import llama_peer

    config = LlamaCppConfig(
        log_path=state_dir() / "bench" / "peers-llama.cpp" / "llama.log", threads=threads
    )

    @contextlib.asynccontextmanager
    async def open_llama() -> AsyncIterator[Endpoint]:
        async with llamacpp_server(config) as base_url:
            # It ignores ignore_eos; min_tokens holds its end-of-text off just as well.
            yield Endpoint(base_url, "none", config.alias, lambda n: {"min_tokens": n})

    peer = llama_peer()
    setup = {
        "version": peer.version,
        "model": config.model.name,
        "threads": threads,
        "context": config.context,
        "build_env": dict(peer.build_env),
        # A developer's own install instead of the venv built with build_env.
        "python_override": os.environ.get(peer.python_env, ""),
        "serves": "one request at a time",
    }
    return Server(peers_report.LLAMACPP, levels, open_llama, setup)


def level_list(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(part) for part in text.split(",") if part}))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=level_list, default=(1, 8, 32, 64), help="streams")
    parser.add_argument(
        "--bf16-levels",
        type=level_list,
        default=None,
        help="vLLM bf16's streams; default: every level where the CPU has bf16 dot products "
        "(there it is vLLM's better dtype, issue #32), 1 and 8 where bf16 is emulated",
    )
    parser.add_argument("--llamacpp-levels", type=level_list, default=(1,))
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument(
        "--sampling",
        type=json.loads,
        default={},
        help="sampling fields for every request, as JSON (default: greedy, temperature 0), "
        'e.g. \'{"temperature": 1, "top_p": 0.9}\'',
    )
    parser.add_argument("--rounds", type=int, default=2, help="requests per stream at a level")
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="every server up at once and their rounds alternated (A B, B A...), so a drifting "
        "host drifts under all of them alike; only for servers that take no CPU while idle "
        "(maas and llama.cpp measured so; check `top` before adding another)",
    )
    parser.add_argument(
        "--min-requests", type=int, default=8, help="at a level, so few streams get a TTFT p99"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    parser.add_argument(
        "--servers",
        default="maas,vllm-float32,vllm-bfloat16,llama.cpp",
        help="which to run, in order (each --maas-variant runs after maas)",
    )
    parser.add_argument(
        "--maas-variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="another maas run with these engine flags, e.g. "
        "'int4=--quantization int4 --quantization-group-size 32' (repeat)",
    )
    parser.add_argument(
        "--variant-levels", type=level_list, help="streams for --maas-variant runs (default: all)"
    )
    parser.add_argument("--maas-args", default="", help="engine flags of the maas run")
    parser.add_argument("--vllm-enforce-eager", action="store_true", help="skip its compile")
    parser.add_argument("--vllm-kv-cache-gib", type=float, default=2.0)
    parser.add_argument(
        "--vllm-cpus",
        default="",
        help="cores its compute threads are bound to, e.g. 0-1 "
        "(default: its own auto, which keeps one core for its API server)",
    )
    parser.add_argument("--llamacpp-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/peers.json"))
    return parser


def maas_variant(text: str) -> tuple[str, list[str]]:
    """--maas-variant NAME=FLAGS as its name and engine flags."""
    label, sep, flags = text.partition("=")
    if not sep or not label:
        raise SystemExit(f"--maas-variant wants NAME=FLAGS, got {text!r}")
    return label, shlex.split(flags)


def bf16_levels(args) -> tuple[int, ...]:
    if args.bf16_levels is not None:
        return args.bf16_levels
    if machine_profile().native_bf16:
        return args.levels
    return tuple(level for level in args.levels if level <= 8)


def servers_from(args) -> list[Server]:
    chosen = []
    for name in args.servers.split(","):
        if name == "maas":
            chosen.append(maas_server("maas", shlex.split(args.maas_args), args.levels))
            for label, flags in map(maas_variant, args.maas_variant):
                levels = args.variant_levels or args.levels
                chosen.append(maas_server(f"maas-{label}", flags, levels))
        elif name == "vllm-float32":
            chosen.append(vllm_server("float32", args.levels, args))
        elif name == "vllm-bfloat16":
            chosen.append(vllm_server("bfloat16", bf16_levels(args), args))
        elif name == peers_report.LLAMACPP:
            chosen.append(llamacpp_server(args.llamacpp_levels, args.llamacpp_threads))
        else:
            raise SystemExit(f"unknown server {name!r}")
    return chosen


async def run(args, argv: list[str]) -> dict:
    servers = servers_from(args)
    report = {
        "benchmark": "bench-peers",
        "command": " ".join(["python -m benchmarks.peers_bench", *map(shlex.quote, argv)]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "params": {
            "levels": list(args.levels),
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "min_requests": args.min_requests,
            "seed": args.seed,
            "api": "POST /v1/completions, stream, ignore_eos",
            "sampling": args.sampling or {"temperature": 0},
            "prompt": story_prompts(args.seed, 1, 1)[0],
        },
        "servers": {},
    }
    if args.interleave:
        report["params"]["interleaved"] = True
        report["servers"] = await measure_interleaved(servers, args)
        write_report(report, args)
        return report
    for server in servers:
        try:
            report["servers"][server.name] = await measure_server(server, args)
        except PEER_FAILURES as error:
            report["servers"][server.name] = failed(server, error)
        # Written after every server: a run stopped later (it takes tens of minutes)
        # keeps what it measured.
        write_report(report, args)
    return report


def write_report(report: dict, args) -> None:
    maas_runs = [name for name in report["servers"] if name.startswith("maas")]
    report["ratios"] = peers_report.ratios(report["servers"], maas_runs, list(args.levels))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    args = build_parser().parse_args()
    report = asyncio.run(run(args, sys.argv[1:]))
    plot = args.output.with_suffix(".png")
    peers_report.plot(report, plot)
    for run_name, per_level in report["ratios"].items():
        for level, entry in per_level.items():
            for side, ratio in entry.items():
                print(
                    f"{run_name} x{level} {side}: {ratio['ratio']}x {ratio['peer']} "
                    f"(target {ratio['target']}, met {ratio['met']})"
                )
    print(f"wrote {args.output} and {plot}")


if __name__ == "__main__":
    main()
