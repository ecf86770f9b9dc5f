"""The engine's load as vLLM's own /metrics reports it, for GetLoad.

Every router replica polls GetLoad about every 0.1-0.5 s; a Prometheus scrape
of vLLM costs it more than our native engine's in-memory snapshot, so one
scrape answers every poll within MAX_AGE_SECONDS. The LoRA adapters held come
from /v1/models in the same scrape (adapters.py), and how many one step may
hold (max_loras) from the max_lora label of vllm:lora_requests_info, which
vLLM publishes only with --enable-lora, from its first step on (the start-up
check runs one): absent, the engine serves no adapters.
"""

import asyncio
import dataclasses
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from maas_services.engine.vllm_backend.adapters import loaded_adapters

MAX_AGE_SECONDS = 0.25


@dataclass(frozen=True)
class VllmLoad:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    block_size: int = 0
    num_blocks: int = 0
    max_loras: int = 0
    adapters: tuple[str, ...] = ()


def parse_metrics(text: str) -> VllmLoad:
    values: dict[str, float] = {}
    cache_info: dict[str, str] = {}
    max_loras = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                cache_info = sample.labels
            elif sample.name == "vllm:lora_requests_info":
                max_loras = _int(sample.labels.get("max_lora"))
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
        max_loras=max_loras,
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
                adapters = await loaded_adapters(self._client)
                self._load = dataclasses.replace(
                    parse_metrics(response.text), adapters=tuple(sorted(adapters))
                )
                self._at = time.monotonic()
        return self._load

    def forget(self) -> None:
        """The next get() scrapes again: an adapter was just loaded or unloaded."""
        self._at = -MAX_AGE_SECONDS
