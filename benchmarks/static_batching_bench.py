"""The whole stack against transformers' static batching: `make bench-static`.

The engine issue's target: 32 requests with seeded output lengths of 16-128
tokens (ignore_eos), all sent at once to the gateway of a local stack (as
`maas up` runs it), against transformers `generate` in static batches of 16
on the same prompt token ids and lengths, in float32 and bf16 (the stronger
one is the baseline). Throughput on both sides is the requested output tokens
per second of wall time, first request sent to last token received.

Each maas variant (engine flags) and each transformers dtype runs alone in
turn; the ratio is taken within the run. With --repeats N the whole set runs N
times, maas first then transformers, then the other way round (A B, B A...):
this host's speed drifts by tens of percent over minutes, and alternating lays
the drift under both sides alike. Each side's rate is then the mean of its runs
(each run is kept). Writes benchmarks/results/static_batching.json.
"""

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from benchmarks.engine_bench import TOPICS, chat_prompt
from benchmarks.hf_static import load_hf_model, static_tokens_per_s
from benchmarks.machine import load_average_1m, machine
from benchmarks.order import in_turn
from benchmarks.peers_bench import maas_server, maas_variant
from maas_services.common.model_files import default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_tools.bench.client import ChatClient

TARGET = 4.0


def workload(tokenizer, requests: int, shortest: int, longest: int, seed: int):
    rng = random.Random(seed)
    prompts = [
        chat_prompt(tokenizer, f"Tell me about {TOPICS[i % len(TOPICS)]}, part {i}.")
        for i in range(requests)
    ]
    return prompts, [rng.randint(shortest, longest) for _ in prompts]


async def through_stack(
    name: str, flags: list[str], prompts: list[list[int]], lengths: list[int], timeout: float
) -> dict:
    print(f"--- {name}: starting", flush=True)
    load_before = load_average_1m()
    async with maas_server(name, flags, ()).open() as endpoint:
        client = ChatClient(endpoint.base_url, endpoint.api_key, endpoint.model, timeout)
        try:
            # First-request costs off the clock.
            await asyncio.gather(*(client.complete(p, 4) for p in prompts[:4]))
            started = time.perf_counter()
            results = await asyncio.gather(
                *(client.complete(p, n) for p, n in zip(prompts, lengths, strict=True))
            )
            wall = time.perf_counter() - started
        finally:
            await client.close()
    errors = sum(1 for r in results if not r.ok)
    tokens = sum(r.completion_tokens or 0 for r in results)
    row = {
        "engine_args": flags,
        "wall_s": round(wall, 2),
        "output_tokens": tokens,
        "output_tokens_per_s": round(sum(lengths) / wall, 2),
        "errors": errors,
        "load_average_1m": {"before": load_before, "after": load_average_1m()},
    }
    print(f"{name}: {row['output_tokens_per_s']} tok/s, errors {errors}", flush=True)
    if errors or tokens != sum(lengths):
        raise SystemExit(f"{name}: {errors} errors, {tokens} of {sum(lengths)} tokens")
    return row


def transformers_rows(
    dtypes: list[str], prompts: list[list[int]], lengths: list[int], batch: int
) -> dict:
    device = torch.device("cpu")
    rows = {}
    for name in dtypes:
        print(f"--- transformers {name}, static batches of {batch}", flush=True)
        load_before = load_average_1m()
        model = load_hf_model(default_model_path(), getattr(torch, name), device)
        rate = static_tokens_per_s(model, prompts, lengths, batch, device)
        rows[name] = {
            "output_tokens_per_s": round(rate, 2),
            "torch_threads": torch.get_num_threads(),
            "load_average_1m": {"before": load_before, "after": load_average_1m()},
        }
        print(f"transformers {name}: {rows[name]['output_tokens_per_s']} tok/s", flush=True)
        del model
    return rows


def mean_of_runs(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each run's rate, and their mean: the figure the ratio takes."""
    return {
        name: {
            "output_tokens_per_s": round(
                sum(row["output_tokens_per_s"] for row in rows) / len(rows), 2
            ),
            "runs": rows,
        }
        for name, rows in runs.items()
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--shortest", type=int, default=16, help="fewest output tokens")
    parser.add_argument("--longest", type=int, default=128, help="most output tokens")
    parser.add_argument("--batch", type=int, default=16, help="transformers' static batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    parser.add_argument("--maas-args", default="", help="engine flags of the maas run")
    parser.add_argument(
        "--maas-variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="another maas run with these engine flags (repeat)",
    )
    parser.add_argument("--hf-dtypes", default="float32,bfloat16", help="transformers dtypes")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="times the whole set runs, maas and transformers first in turn (module docstring)",
    )
    parser.add_argument(
        "--output", type=Path, default=Path("benchmarks/results/static_batching.json")
    )
    return parser


async def run(args, argv: list[str]) -> dict:
    tokenizer = load_tokenizer(default_model_path())
    prompts, lengths = workload(tokenizer, args.requests, args.shortest, args.longest, args.seed)
    variants = [("maas", shlex.split(args.maas_args)), *map(maas_variant, args.maas_variant)]
    maas_runs: dict[str, list[dict]] = {}
    hf_runs: dict[str, list[dict]] = {}

    async def maas_side() -> None:
        for name, flags in variants:
            label = name if name == "maas" else f"maas-{name}"
            row = await through_stack(label, flags, prompts, lengths, args.timeout)
            maas_runs.setdefault(label, []).append(row)

    async def transformers_side() -> None:
        rows = transformers_rows(args.hf_dtypes.split(","), prompts, lengths, args.batch)
        for dtype, row in rows.items():
            hf_runs.setdefault(dtype, []).append(row)

    for repeat in range(args.repeats):
        for side in in_turn((maas_side, transformers_side), repeat):
            await side()
    maas, hf = mean_of_runs(maas_runs), mean_of_runs(hf_runs)
    baseline = max(row["output_tokens_per_s"] for row in hf.values())
    return {
        "benchmark": "bench-static",
        "command": shlex.join(["python", "-m", "benchmarks.static_batching_bench", *argv]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "workload": {
            "requests": args.requests,
            "output_tokens": sum(lengths),
            "lengths": [args.shortest, args.longest],
            "seed": args.seed,
            "transformers_batch": args.batch,
            "repeats": args.repeats,
        },
        "maas": maas,
        "transformers": hf,
        "ratios": {
            label: {
                "vs_best_transformers": round(row["output_tokens_per_s"] / baseline, 2),
                "target": TARGET,
                "met": row["output_tokens_per_s"] / baseline >= TARGET,
            }
            for label, row in maas.items()
        },
    }


def main() -> None:
    argv = sys.argv[1:]
    args = build_parser().parse_args(argv)
    report = asyncio.run(run(args, argv))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"], indent=2))


if __name__ == "__main__":
    main()
