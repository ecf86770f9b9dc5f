"""Prefix-cache hit rates read from the engines' Prometheus /metrics.

Counters are scraped before and after a run; the rate is hit tokens over
queried tokens in between, so warm-up traffic and earlier runs don't count.
"""

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

QUERIED = "maas_engine_prefix_cache_queried_tokens_total"
HITS = "maas_engine_prefix_cache_hit_tokens_total"
PREEMPTIONS = "maas_engine_preemptions_total"
COUNTERS = (QUERIED, HITS, PREEMPTIONS)


def parse(text: str) -> dict[str, float]:
    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


async def scrape(urls: dict[str, str]) -> dict[str, dict[str, float]]:
    async with httpx.AsyncClient(timeout=10) as http:
        replies = await asyncio.gather(*(http.get(url) for url in urls.values()))
    return {name: parse(reply.text) for name, reply in zip(urls, replies, strict=True)}


def hit_rates(before: dict, after: dict) -> dict:
    def delta(name: str, metric: str) -> float:
        return after[name][metric] - before.get(name, {}).get(metric, 0.0)

    per_engine = {}
    for name in sorted(after):
        queried, hits = delta(name, QUERIED), delta(name, HITS)
        per_engine[name] = {
            "queried_tokens": int(queried),
            "hit_tokens": int(hits),
            "hit_rate": round(hits / queried, 4) if queried else 0.0,
            "preemptions": int(delta(name, PREEMPTIONS)),
        }
    queried = sum(e["queried_tokens"] for e in per_engine.values())
    hits = sum(e["hit_tokens"] for e in per_engine.values())
    return {
        "hit_rate": round(hits / queried, 4) if queried else 0.0,
        "queried_tokens": queried,
        "hit_tokens": hits,
        "per_engine": per_engine,
    }
