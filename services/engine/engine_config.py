"""The engine's configuration, and the one function that builds it from EngineSettings.

Serving (core/build.py), offline engines (offline.py), benchmarks and tests all
go through build_configs, so a setting means the same thing everywhere.
"""

import dataclasses
from dataclasses import dataclass, field

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.scheduler import SchedulerConfig
from maas_services.engine.settings import EngineSettings
from maas_services.engine.spec.config import SpecConfig


@dataclass
class EngineConfig:
    num_blocks: int
    max_model_len: int
    block_size: int = BLOCK_SIZE
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Part of every block hash: caches of different weights never match.
    cache_salt: str = ""
    # "tenant" or "global": whether requests may ask to share blocks across tenants.
    prefix_cache_sharing: str = "tenant"
    speculative: SpecConfig = field(default_factory=SpecConfig)
    # LoRA (lora/registry.py): distinct adapters one step may hold (0: none served), the
    # highest rank loaded, and how many stay loaded (idle ones beyond it evicted by LRU).
    max_loras: int = 8
    max_lora_rank: int = 16
    max_cpu_loras: int = 32


def build_configs(
    settings: EngineSettings, model: ModelConfig, num_blocks: int
) -> tuple[EngineConfig, ModelConfig]:
    """The engine's config for a pool of num_blocks, and the model's, its context capped."""
    max_model_len = min(settings.max_model_len or model.max_model_len, model.max_model_len)
    config = EngineConfig(
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        block_size=settings.block_size,
        scheduler=SchedulerConfig(
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            enable_chunked_prefill=settings.enable_chunked_prefill,
        ),
        cache_salt=settings.cache_salt or settings.model_id,
        prefix_cache_sharing=settings.prefix_cache_sharing,
        speculative=SpecConfig(
            method=settings.speculative_method,
            num_tokens=settings.num_speculative_tokens,
            max_batch=settings.speculative_max_batch,
            draft_model=settings.speculative_draft_model,
            draft_context=settings.speculative_draft_context,
        ),
        max_loras=settings.max_loras,
        max_lora_rank=settings.max_lora_rank,
        max_cpu_loras=settings.max_cpu_loras,
    )
    return config, dataclasses.replace(model, max_model_len=max_model_len)
