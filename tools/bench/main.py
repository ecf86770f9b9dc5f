"""`maas bench --scenario NAME`: run a workload, write a JSON report and a PNG.

With --base-url it measures that server once. Without, it starts local mode
for each --routing-policy in turn (the scenario's default policies by
default) and each --engine-variant, with --engine-replicas engines whose KV
cache holds --kv-cache-fraction of the workload's working set, and compares
them. Unknown flags go to every engine, as with `maas up`.
"""

import argparse
import asyncio
import json
import math
import os
import platform
import shlex
from datetime import UTC, datetime
from pathlib import Path

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.bench import workload_args
from maas_tools.bench.client import ChatClient, RequestResult
from maas_tools.bench.goodput import Slo
from maas_tools.bench.report import plot_inputs, print_summary
from maas_tools.bench.runner import dev_api_key, engine_metrics_urls, measure, warm_up
from maas_tools.bench.scenario import Scenario
from maas_tools.bench.scenarios import SCENARIOS

POLICIES = ("prefix_affinity", "least_load", "round_robin")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maas bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--seed", type=int, default=0, help="the same seed, the same workload")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument(
        "--warmup-requests", type=int, default=8, help="short requests before measuring"
    )
    slo = parser.add_argument_group("goodput: requests meeting every SLO given")
    slo.add_argument("--slo-ttft-ms", type=float, help="time to first token at most")
    slo.add_argument("--slo-tpot-ms", type=float, help="time per output token at most")
    remote = parser.add_argument_group("an existing server")
    remote.add_argument("--base-url", default="", help="e.g. http://127.0.0.1:8080/v1")
    remote.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY", ""), help="default: .maas's"
    )
    remote.add_argument("--model", default=DEFAULT_MODEL_ID)
    remote.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        help="an engine's /metrics as NAME=URL or URL (repeat); default: .maas/stack.json's",
    )
    local = parser.add_argument_group("local mode, started once per policy and engine variant")
    local.add_argument("--routing-policy", action="append", choices=POLICIES, default=[])
    local.add_argument(
        "--engine-variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="extra engine flags for one run, e.g. "
        "'chunked=--max-num-batched-tokens 256' (repeat to compare)",
    )
    local.add_argument("--engine-replicas", type=int, default=4)
    local.add_argument("--kv-cache-memory", type=int, default=0, help="bytes per engine")
    local.add_argument(
        "--kv-cache-fraction",
        type=float,
        help="size each engine's KV cache to this share of the working set "
        "(0: engine default; default: the scenario's)",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--output", type=Path, help="JSON report (default: benchmarks/results/)")
    output.add_argument("--plot", type=Path, help="PNG of CDFs and throughput (default: beside)")
    workload_args.add_shared_arguments(parser)
    for scenario in SCENARIOS.values():
        scenario.add_arguments(parser)
    return parser


def engine_variants(flags: list[str]) -> dict[str, list[str]]:
    """NAME=FLAGS -> {NAME: [flag, ...]}; none given: one unnamed variant."""
    variants = {}
    for flag in flags:
        name, sep, engine_flags = flag.partition("=")
        if not sep or not name:
            raise SystemExit(f"--engine-variant wants NAME=FLAGS, got {flag!r}")
        variants[name] = shlex.split(engine_flags)
    return variants or {"": []}


def run_labels(policies: tuple[str, ...], variants: dict[str, list[str]]):
    """(label, policy, variant name) per local run; labels name only what varies."""
    for policy in policies:
        for name in variants:
            parts = [policy] if len(policies) > 1 or not name else []
            yield "/".join([*parts, name] if name else parts), policy, name


async def run_remote(args, scenario: Scenario, slo: Slo) -> tuple[dict, list[RequestResult]]:
    metrics = engine_metrics_urls(args.metrics_url)
    client = ChatClient(args.base_url, args.api_key or dev_api_key(), args.model, args.timeout)
    try:
        await warm_up(client, args.warmup_requests)
        return await measure(scenario, client, args.max_tokens, metrics, "remote", slo)
    finally:
        await client.close()


async def run_local(args, scenario: Scenario, slo: Slo, policy: str, label: str, engine_args):
    from maas_tools.bench.local_stack import local_stack

    async with local_stack(policy, args.engine_replicas, engine_args, label) as stack:
        engines = {k: v for k, v in stack.metrics_urls.items() if k.startswith("engine-")}
        client = ChatClient(f"{stack.gateway_url}/v1", stack.api_key, args.model, args.timeout)
        try:
            await warm_up(client, args.warmup_requests)
            return await measure(scenario, client, args.max_tokens, engines, label, slo)
        finally:
            await client.close()


def size_kv_cache(args, scenario: Scenario, engine_args: list[str]) -> tuple[list[str], dict]:
    """Engine flags with the KV cache sized for this workload, and what was chosen."""
    working_set = scenario.working_set_tokens()
    fraction = (
        scenario.kv_cache_fraction if args.kv_cache_fraction is None else args.kv_cache_fraction
    )
    setup = {"engine_replicas": args.engine_replicas, "working_set_tokens": working_set}
    if args.kv_cache_memory or fraction:
        from maas_tools.bench.kv_sizing import kv_block_bytes

        per_block, block_size = kv_block_bytes(engine_args)
        # Never below one whole request of the workload: the engine would refuse it.
        wanted = max(working_set * fraction, scenario.largest_request_tokens())
        memory = args.kv_cache_memory or math.ceil(wanted / block_size) * per_block
        tokens = memory // per_block * block_size
        engine_args = [*engine_args, f"--kv-cache-memory={memory}"]
        setup |= {
            "kv_cache_memory_bytes": memory,
            "kv_cache_tokens_per_replica": tokens,
            "kv_cache_share_of_working_set": round(tokens / working_set, 3),
        }
    setup["engine_args"] = engine_args
    return engine_args, setup


def main(argv: list[str]) -> int:
    args, engine_args = build_parser().parse_known_args(argv)
    scenario = SCENARIOS[args.scenario].from_args(args)
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    runs, samples = {}, {}
    if args.base_url:
        setup = {"base_url": args.base_url}
        runs["remote"], samples["remote"] = asyncio.run(run_remote(args, scenario, slo))
    else:
        engine_args, setup = size_kv_cache(args, scenario, engine_args)
        variants = engine_variants(args.engine_variant)
        if args.engine_variant:
            setup["engine_variants"] = variants
        policies = tuple(args.routing_policy) or scenario.default_policies
        for label, policy, variant in run_labels(policies, variants):
            flags = [*engine_args, *variants[variant]]
            runs[label], samples[label] = asyncio.run(
                run_local(args, scenario, slo, policy, label, flags)
            )
    verdict = scenario.verdict(runs)
    output = args.output or Path("benchmarks/results") / f"bench_{scenario.name}.json"
    plot = args.plot or output.with_suffix(".png")
    output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "maas bench",
        "scenario": scenario.name,
        "command": " ".join(["maas", "bench", *map(shlex.quote, argv)]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "params": scenario.describe(),
        "setup": setup,
        "runs": runs,
        "verdict": verdict,
    }
    output.write_text(json.dumps(report, indent=2) + "\n")
    print_summary(runs, verdict)
    # The plot needs matplotlib, an extra (maas[bench]): the run's JSON is its result.
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"wrote {output}; no plot: install maas[bench] (matplotlib) for {plot}")
        return 0
    from maas_tools.bench.plot import plot_run

    plot_run(*plot_inputs(runs, samples), plot, f"maas bench --scenario {scenario.name}")
    print(f"wrote {output} and {plot}")
    return 0
