"""Turn request results into the numbers the report shows."""

import math
import statistics
from collections import Counter

from maas_tools.bench.client import RequestResult
from maas_tools.bench.goodput import Slo, goodput
from maas_tools.bench.timeline import BUCKET_S, output_tokens_per_s

PERCENTILES = (50, 90, 95, 99)


def distribution(values: list[float]) -> dict[str, float]:
    """Mean and percentiles, in seconds; empty when there is nothing to measure."""
    if not values:
        return {}
    ordered = sorted(values)
    summary = {"mean": statistics.fmean(ordered)}
    for p in PERCENTILES:
        # Nearest rank: always a value that was observed.
        summary[f"p{p}"] = ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]
    return {k: round(v, 5) for k, v in summary.items()}


def summarize(
    results: list[RequestResult],
    wall_seconds: float,
    *,
    origin: float | None = None,
    slo: Slo | None = None,
) -> dict:
    """The run's numbers; with several request kinds, each kind's too, under "classes".

    origin (the perf_counter time the run started) adds throughput over time.
    """
    ok = [r for r in results if r.ok]
    completion = sum(r.completion_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    summary = {
        "requests": len(results),
        "succeeded": len(ok),
        "errors": dict(Counter(r.error for r in results if not r.ok)),
        "wall_seconds": round(wall_seconds, 3),
        "ttft_s": distribution([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": distribution([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": distribution([gap for r in ok for gap in r.itl]),
        "e2e_s": distribution([r.e2e for r in ok]),
        "throughput": {
            "requests_per_s": round(len(ok) / wall_seconds, 4) if wall_seconds else 0.0,
            "output_tokens_per_s": round(completion / wall_seconds, 3) if wall_seconds else 0.0,
            "total_tokens_per_s": round((completion + prompt) / wall_seconds, 3)
            if wall_seconds
            else 0.0,
        },
        "tokens": {"prompt": prompt, "completion": completion, "cached_prompt": cached},
        "prompt_tokens_mean": round(prompt / len(ok), 1) if ok else 0.0,
        # What the API reported as cached (usage.prompt_tokens_details), over all prompts.
        "usage_cached_ratio": round(cached / prompt, 4) if prompt else 0.0,
        "goodput": goodput(results, wall_seconds, slo or Slo()),
    }
    if origin is not None:
        summary["throughput_over_time"] = {
            "bucket_s": BUCKET_S,
            "output_tokens_per_s": output_tokens_per_s(results, origin),
        }
    kinds = sorted({r.kind for r in results})
    if len(kinds) > 1:
        # A mixed workload's point is usually one class's latency while the
        # other runs (chat ITL during long prefills); the pooled numbers blur it.
        summary["classes"] = {
            kind: summarize(
                [r for r in results if r.kind == kind], wall_seconds, origin=origin, slo=slo
            )
            for kind in kinds
        }
    return summary
