"""Build the LLMEngine from settings: load the model, size the KV cache.

Runs in the engine-core process (process.py), which computes on every
physical core it may run on unless --torch-threads says otherwise
(services/engine/machine_defaults.py), one fewer in narrow steps
(compute_threads.py).
"""

import os
import time

import torch

from maas_services.common.logging import get_logger
from maas_services.common.machine_profile import machine_profile
from maas_services.common.model_files import resolve_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.device import resolve_device, resolve_dtype, resolve_kv_cache_dtype
from maas_services.engine.engine_config import build_configs
from maas_services.engine.kv_budget import kv_cache_bytes, model_bytes, num_blocks
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.llm_engine import LLMEngine
from maas_services.engine.loader import load_model
from maas_services.engine.machine_defaults import resolve
from maas_services.engine.model_runner import ModelRunner, choose_path
from maas_services.engine.quantization.checkpoint_blocks import checkpoint_blocks
from maas_services.engine.quantization.config import QuantizationConfig
from maas_services.engine.settings import EngineSettings

log = get_logger(__name__)


def build_engine(settings: EngineSettings) -> LLMEngine:
    path = resolve_model_path(settings.model_path)
    device = resolve_device(settings.device)
    # The launcher resolved `auto` already (and logged why); this fills it in
    # for an engine built in-process.
    settings = resolve(settings, machine_profile(), device.type == "cuda", os.environ).settings
    torch.set_num_threads(settings.torch_threads)
    dtype = resolve_dtype(settings.dtype, device)
    started = time.perf_counter()
    quantization = QuantizationConfig(
        settings.quantization,
        settings.quantization_group_size,
        activations=settings.quantization_activations,
    )
    model, config = load_model(path, dtype, device, progress=True, quantization=quantization)
    tokenizer = load_tokenizer(path)
    # The compute path (eager, compiled or native: compute_path.py) is chosen here, once,
    # before the KV cache is sized: the weight copies it keeps are weights too.
    # A float32 model's steps from its file's blocks (a quantized one has its own).
    blocks = {}
    if settings.kernel_weights == "checkpoint" and not quantization.enabled:
        blocks = checkpoint_blocks(model, path)
    compute_path = choose_path(
        model,
        compiled=not settings.enforce_eager,
        native=settings.native_layers,
        wide_gemm=settings.wide_gemm,
        blocks=blocks,
        blocks_int16=settings.kernel_activations == "int16",
    )
    weight_bytes = model_bytes(model) + compute_path.extra_bytes
    memory = kv_cache_bytes(settings, device, weight_bytes)
    kv_dtype = resolve_kv_cache_dtype(settings.kv_cache_dtype, dtype, device)
    blocks = num_blocks(settings, config, kv_dtype, memory)
    engine_config, config = build_configs(settings, config, blocks)
    cache = PagedKVCache.allocate(config, blocks, engine_config.block_size, kv_dtype, device)
    runner = ModelRunner(model, config, cache, device, path=compute_path)
    log.info(
        "engine_ready",
        path=str(path),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        kv_cache_dtype=str(kv_dtype).removeprefix("torch."),
        quantization=quantization.describe(),
        **runner.path.describe(),
        torch_threads=torch.get_num_threads(),
        weight_bytes=weight_bytes,
        max_model_len=config.max_model_len,
        kv_cache_bytes=memory,
        kv_cache_blocks=blocks,
        kv_cache_tokens=blocks * engine_config.block_size,
        load_seconds=round(time.perf_counter() - started, 2),
    )
    return LLMEngine(engine_config, config, runner, tokenizer)
