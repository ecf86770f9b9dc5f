"""The model-server protocol's metrics, under vLLM's names, beside maas_engine_*.

An endpoint picker of the Gateway API Inference Extension (GIE's EPP, llm-d's
inference scheduler) scores each pod of an InferencePool from a few series it
scrapes from the pod's /metrics (GIE docs/proposals/003-model-server-protocol):
the queue, the running batch, the KV-cache use, the cache's shape for its
prefix scorer and the LoRA adapters for its LoRA affinity. Pickers match them
by vLLM's names, so those are the names here, not maas_engine_*: a picker
configured for vLLM (the default everywhere) then reads a maas engine as is.

They are read at scrape time from the load the core sends with every step
(AsyncEngine.load, what GetLoad answers) and the facts it reported once ready
(AsyncEngine.info); the core's own maas_engine_* series are relayed with only
some steps (core/metrics_relay.py) and may lag a busy engine by a few steps.

vllm:lora_requests_info names the adapters of running and of waiting requests
(comma lists, as vLLM's) and how many one step may hold (max_lora, 0 on an
engine that serves none: a picker then knows there is nothing to be affine
to). Its value is, as vLLM's, the time of the state it describes: now.
"""

import time

from prometheus_client.core import GaugeMetricFamily

from maas_services.engine.async_engine import AsyncEngine


class ModelServerMetrics:
    """A collector of the protocol's series for one engine's model."""

    def __init__(self, engine: AsyncEngine, model_id: str):
        self._engine = engine
        self._model_id = model_id

    def describe(self):
        # Registered before the core is ready is fine: names only, no values.
        return self._families(with_values=False)

    def collect(self):
        return self._families(with_values=True)

    def _families(self, with_values: bool) -> list[GaugeMetricFamily]:
        model = ["model_name"]
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests waiting to be admitted to a step", labels=model
        )
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Sequences in the running batch", labels=model
        )
        kv_usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent", labels=model
        )
        cache_config = GaugeMetricFamily(
            "vllm:cache_config_info",
            "The KV cache's shape (value 1): tokens per block, blocks in all",
            labels=["block_size", "num_gpu_blocks"],
        )
        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "LoRA adapters running and waiting (value: the time of this state)",
            labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        families = [waiting, running, kv_usage, cache_config, lora]
        info = self._engine.info
        if not with_values or info is None:
            return families
        load = self._engine.load
        waiting.add_metric([self._model_id], load.waiting)
        running.add_metric([self._model_id], load.running)
        kv_usage.add_metric([self._model_id], load.kv_cache_usage)
        cache_config.add_metric([str(info.block_size), str(info.num_blocks)], 1)
        lora.add_metric(
            [str(info.max_loras), ",".join(load.running_adapters), ",".join(load.waiting_adapters)],
            time.time(),
        )
        return families
