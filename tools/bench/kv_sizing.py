"""KV-cache bytes that hold a given number of tokens, for the engines a run starts.

Computed exactly as the engine sizes its cache (model shape, dtype, block
size), from the engine's own flags, so "a third of the working set" means
what it says on any model or machine.
"""

import json
from pathlib import Path

from gguf import GGUFReader

from maas_services.common.model_files import resolve_model_path
from maas_services.common.settings import parse_settings
from maas_services.engine.device import resolve_device, resolve_dtype
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.settings import EngineSettings


def _model_config(path: Path) -> ModelConfig:
    if path.suffix == ".gguf":
        return ModelConfig.from_gguf(GGUFReader(path))
    return ModelConfig.from_hf_config(json.loads((path / "config.json").read_text()))


def kv_block_bytes(engine_args: list[str]) -> tuple[int, int]:
    """(bytes of one KV block, tokens per block) for engines started with these flags."""
    settings = parse_settings(EngineSettings, engine_args, prog="maas serve engine")
    config = _model_config(resolve_model_path(settings.model_path))
    dtype = resolve_dtype(settings.dtype, resolve_device(settings.device))
    return PagedKVCache.bytes_per_block(config, settings.block_size, dtype), settings.block_size
