"""The engine's load as vLLM's own /metrics reports it, for GetLoad.

Every router replica polls GetLoad about every 0.1-0.5 s; a Prometheus scrape
of vLLM costs it more than our native engine's in-memory snapshot, so one
scrape answers every poll within MAX_AGE_SECONDS.
"""

import asyncio
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

MAX_AGE_SECONDS = 0.25


@dataclass(frozen=True)
class VllmLoad:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    block_size: int = 0
    num_blocks: int = 0


def parse_metrics(text: str) -> VllmLoad:
    values: dict[str, float] = {}
    cache_info: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                cache_info = sample.labels
            elif sample.name in (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
            ):
                # One series per engine core of the server: their sum is the server's.
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return VllmLoad(
        running=int(values.get("vllm:num_requests_running", 0)),
        waiting=int(values.get("vllm:num_requests_waiting", 0)),
        kv_cache_usage=values.get("vllm:kv_cache_usage_perc", 0.0),
        block_size=_int(cache_info.get("block_size")),
        num_blocks=_int(cache_info.get("num_gpu_blocks")),
    )


def _int(label: str | None) -> int:
    try:
        return int(label) if label else 0
    except ValueError:  # "None" before the KV cache is sized
        return 0


class LoadCache:
    def __init__(self, client: httpx.AsyncClient):
        self._client = client
        self._load = VllmLoad()
        self._at = -MAX_AGE_SECONDS
        self._lock = asyncio.Lock()

    async def get(self) -> VllmLoad:
        """Raises httpx.HTTPError when vLLM cannot be scraped."""
        async with self._lock:  # concurrent polls share one scrape
            if time.monotonic() - self._at >= MAX_AGE_SECONDS:
                response = await self._client.get("/metrics")
                response.raise_for_status()
                self._load = parse_metrics(response.text)
                self._at = time.monotonic()
        return self._load
