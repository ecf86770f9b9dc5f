"""One measured run of a scenario against an OpenAI endpoint, engine metrics around it."""

import asyncio
import json
import os
import time
from pathlib import Path

from tqdm import tqdm

from maas_tools.bench.client import ChatClient, RequestResult
from maas_tools.bench.engine_metrics import hit_rates, scrape
from maas_tools.bench.goodput import Slo
from maas_tools.bench.scenario import Scenario, Send
from maas_tools.bench.stats import summarize


async def warm_up(client: ChatClient, count: int) -> None:
    """Short, unrelated requests, so no engine pays its first-request costs on the clock."""
    await asyncio.gather(
        *(
            client.chat(
                [{"role": "system", "content": f"warm up {i}"}, {"role": "user", "content": "hi"}],
                max_tokens=2,
            )
            for i in range(count)
        )
    )


def sender(client: ChatClient, default_max_tokens: int, on_result=None) -> Send:
    """The scenario's Send: per-request max_tokens or the run's, kind recorded."""

    async def send(
        messages: list[dict], session: str = "", *, max_tokens: int = 0, kind: str = ""
    ) -> RequestResult:
        result = await client.chat(messages, max_tokens or default_max_tokens, session)
        result.kind = kind
        if on_result:
            on_result(result)
        return result

    return send


async def measure(
    scenario: Scenario,
    client: ChatClient,
    max_tokens: int,
    engine_metrics: dict[str, str],
    label: str,
    slo: Slo | None = None,
) -> tuple[dict, list[RequestResult]]:
    """The scenario's summary (prefix-cache hit rates included when engines are known)."""
    results: list[RequestResult] = []
    bar = tqdm(total=scenario.total_requests(), desc=label, unit="req")

    def record(result: RequestResult) -> None:
        results.append(result)
        bar.update()

    await scenario.prepare(sender(client, max_tokens))
    before = await scrape(engine_metrics) if engine_metrics else {}
    started = time.perf_counter()
    try:
        await scenario.run(sender(client, max_tokens, record))
    finally:
        bar.close()
    summary = summarize(results, time.perf_counter() - started, origin=started, slo=slo)
    after = await scrape(engine_metrics) if engine_metrics else {}
    summary["prefix_cache"] = hit_rates(before, after) if engine_metrics else None
    return summary, results


def state_dir() -> Path:
    return Path(os.environ.get("MAAS_STATE_DIR", ".maas"))


def engine_metrics_urls(flags: list[str]) -> dict[str, str]:
    """From NAME=URL or URL flags, else the engines a running `maas up` recorded."""
    if flags:
        urls = {}
        for i, flag in enumerate(flags):
            name, sep, url = flag.partition("=")
            urls[name if sep else f"engine-{i}"] = url if sep else flag
        return urls
    recorded = state_dir() / "stack.json"
    if not recorded.exists():
        return {}
    metrics = json.loads(recorded.read_text()).get("metrics", {})
    return {name: url for name, url in metrics.items() if name.startswith("engine-")}


def dev_api_key() -> str:
    key = state_dir() / "dev-api-key"
    return key.read_text().strip() if key.exists() else ""
