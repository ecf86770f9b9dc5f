"""`make bench-vllm`: what our path costs in front of vLLM, and prefix routing over vLLM replicas.

Issue #14's two figures, with maas bench's own client (tools/bench):

1. Added latency. Local mode with one vLLM replica (`maas up --engine-backend
   vllm`); the same streamed chat requests go through our gateway (auth,
   limits, tokenizer, router, the adapter's gRPC stream, billing) and straight
   to that vLLM server's own OpenAI API, in alternating rounds so drift in the
   machine's load falls on both alike. Every request's prompt is new, so
   neither path is helped by the other's prefix cache. TTFT and ITL p50/p99 at
   each stream count; the target is <= 5 ms added TTFT p50 at one stream. On a
   2-core machine the rest of the stack competes with vLLM for the CPU, so
   the figure includes that.
2. Routing. The shared-prefix scenario (tools/bench/scenarios/shared_prefix.py)
   over two vLLM replicas, prefix_affinity against round_robin: the share of
   prompt tokens vLLM served from its cache (usage's cached_tokens) and TTFT.

JSON at --output, a PNG of each part beside it.
"""

import argparse
import asyncio
import json
import os
import random
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.machine import cpu_model
from benchmarks.order import in_turn
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.bench import engine_metrics
from maas_tools.bench.client import ChatClient, RequestResult
from maas_tools.bench.plot import plot_run
from maas_tools.bench.report import plot_inputs
from maas_tools.bench.runner import measure
from maas_tools.bench.scenarios.shared_prefix import SharedPrefix
from maas_tools.bench.stats import summarize
from maas_tools.bench.text import words
from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig
from maas_tools.local.vllm_replicas import VllmOptions

TARGET_ADDED_TTFT_P50_S = 0.005


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_bench", description=__doc__)
    parser.add_argument("--streams", default="1,8", help="concurrent streams, comma-separated")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the two paths")
    parser.add_argument(
        "--requests-per-stream", type=int, default=4, help="sequential requests per stream a round"
    )
    parser.add_argument("--prompt-words", type=int, default=200, help="about one token each")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="per vLLM replica")
    # 24 groups' working set (~34k tokens) is more than one replica's 1 GiB of KV
    # cache holds (23,296 tokens of SmolLM2 in float32) and less than two do:
    # the caches must choose, which is where affinity pays.
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--users-per-group", type=int, default=SharedPrefix.users_per_group)
    parser.add_argument("--routing-rounds", type=int, default=SharedPrefix.rounds)
    parser.add_argument(
        "--system-prompt-tokens", type=int, default=SharedPrefix.system_prompt_tokens
    )
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-routing", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/vllm.json"))
    return parser


def vllm_stack(label: str, replicas: int, policy: str, kv_cache_gib: int) -> Stack:
    state = Path(os.environ.get("MAAS_STATE_DIR", ".maas")) / "bench" / f"vllm-{label}"
    return Stack(
        StackConfig(
            state_dir=state,
            gateway_port=free_port(),
            engine_replicas=replicas,
            routing_policy=policy,
            engine_backend="vllm",
            vllm=VllmOptions(kv_cache_gib=kv_cache_gib),
        )
    )


async def _streams(
    client: ChatClient, streams: int, requests: int, prompts, max_tokens: int
) -> list[RequestResult]:
    async def stream() -> list[RequestResult]:
        return [
            await client.chat([{"role": "user", "content": next(prompts)}], max_tokens)
            for _ in range(requests)
        ]

    return [r for part in await asyncio.gather(*(stream() for _ in range(streams))) for r in part]


def _p(summary: dict, metric: str, percentile: str) -> float | None:
    return summary[metric].get(percentile)


def _added(gateway: dict, direct: dict) -> dict:
    added = {}
    for metric in ("ttft_s", "itl_s"):
        for percentile in ("p50", "p99"):
            ours, theirs = _p(gateway, metric, percentile), _p(direct, metric, percentile)
            if ours is not None and theirs is not None:
                added[f"{metric[:-2]}_{percentile}_ms"] = round((ours - theirs) * 1000, 2)
    return added


async def overhead(args) -> tuple[dict, dict, dict]:
    """Gateway against direct, per stream count: summaries, samples, added latency."""
    rng = random.Random(f"{args.seed}/overhead")
    prompts = iter(lambda: words(rng, args.prompt_words), None)
    stack = vllm_stack("overhead", 1, "prefix_affinity", args.kv_cache_gib)
    runs, samples, added = {}, {}, {}
    try:
        await stack.start()
        paths = {
            "gateway": ChatClient(
                f"{stack.gateway_url}/v1", stack.api_key, DEFAULT_MODEL_ID, args.timeout
            ),
            "direct": ChatClient(
                f"{stack.vllm_urls['vllm-0']}/v1", "none", DEFAULT_MODEL_ID, args.timeout
            ),
        }
        for client in paths.values():  # first-request costs off the clock
            await _streams(client, 2, 1, prompts, 4)
        for streams in (int(s) for s in args.streams.split(",")):
            gathered = {name: [] for name in paths}
            wall = dict.fromkeys(paths, 0.0)
            for round_ in range(args.rounds):
                for name in in_turn(paths, round_):
                    started = time.perf_counter()
                    gathered[name] += await _streams(
                        paths[name], streams, args.requests_per_stream, prompts, args.max_tokens
                    )
                    wall[name] += time.perf_counter() - started
            for name, results in gathered.items():
                label = f"{name} x{streams}"
                runs[label], samples[label] = summarize(results, wall[name]), results
            added[str(streams)] = _added(runs[f"gateway x{streams}"], runs[f"direct x{streams}"])
            print(f"{streams} stream(s): gateway minus direct {added[str(streams)]}", flush=True)
        for client in paths.values():
            await client.close()
    finally:
        stack.stop()
    return runs, samples, added


# vLLM's own counters under the names maas_tools.bench.engine_metrics reads for ours.
_VLLM_COUNTERS = {
    "vllm:prefix_cache_queries_total": engine_metrics.QUERIED,
    "vllm:prefix_cache_hits_total": engine_metrics.HITS,
    "vllm:num_preemptions_total": engine_metrics.PREEMPTIONS,
}


async def _vllm_counters(urls: dict[str, str]) -> dict[str, dict[str, float]]:
    counters = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for name, url in urls.items():
            totals = dict.fromkeys(_VLLM_COUNTERS.values(), 0.0)
            for family in text_string_to_metric_families((await http.get(f"{url}/metrics")).text):
                for sample in family.samples:
                    if sample.name in _VLLM_COUNTERS:
                        totals[_VLLM_COUNTERS[sample.name]] += sample.value
            counters[name] = totals
    return counters


async def routing(args) -> tuple[dict, dict]:
    """The shared-prefix scenario over two vLLM replicas, per routing policy."""
    scenario = SharedPrefix(
        groups=args.groups,
        users_per_group=args.users_per_group,
        rounds=args.routing_rounds,
        system_prompt_tokens=args.system_prompt_tokens,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    runs, samples = {}, {}
    for policy in scenario.default_policies:
        stack = vllm_stack(policy, 2, policy, args.kv_cache_gib)
        try:
            await stack.start()
            client = ChatClient(
                f"{stack.gateway_url}/v1", stack.api_key, DEFAULT_MODEL_ID, args.timeout
            )
            before = await _vllm_counters(stack.vllm_urls)
            runs[policy], samples[policy] = await measure(
                scenario, client, args.max_tokens, {}, policy
            )
            after = await _vllm_counters(stack.vllm_urls)
            # measure() primes each group's prompt first; these counters include
            # that priming, which both policies send alike.
            runs[policy]["prefix_cache"] = engine_metrics.hit_rates(before, after)
            await client.close()
        finally:
            stack.stop()
    params = {**scenario.describe(), "working_set_tokens": scenario.working_set_tokens()}
    return {"params": params, "runs": runs, "verdict": scenario.verdict(runs)}, samples


def _plot(runs: dict, samples: dict, path: Path, title: str) -> None:
    plot_run(*plot_inputs(runs, samples), path, title)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    report = {
        "benchmark": "vllm_bench",
        "command": " ".join(["python -m benchmarks.vllm_bench", *map(shlex.quote, argv)]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu_model": cpu_model(), "cpu_count": os.cpu_count()},
        "load_average_before": os.getloadavg(),
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    if not args.skip_overhead:
        runs, samples, added = asyncio.run(overhead(args))
        first = added.get(args.streams.split(",")[0], {})
        report["overhead"] = {
            "added_ms": added,
            "target_added_ttft_p50_ms": TARGET_ADDED_TTFT_P50_S * 1000,
            "target_met_at_first_level": first.get("ttft_p50_ms", float("inf"))
            <= TARGET_ADDED_TTFT_P50_S * 1000,
            "runs": runs,
        }
        _plot(
            runs,
            samples,
            args.output.with_name(f"{args.output.stem}_overhead.png"),
            "vLLM: gateway vs direct",
        )
    if not args.skip_routing:
        report["routing"], samples = asyncio.run(routing(args))
        _plot(
            report["routing"]["runs"],
            samples,
            args.output.with_name(f"{args.output.stem}_routing.png"),
            "two vLLM replicas, shared prefix: prefix_affinity vs round_robin",
        )
    report["load_average_after"] = os.getloadavg()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
