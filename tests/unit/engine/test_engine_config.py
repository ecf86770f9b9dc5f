"""The one builder from EngineSettings to the engine's configs."""

import dataclasses

from maas_services.common.block_hash import BLOCK_SIZE
from maas_services.engine.engine_config import build_configs
from maas_services.engine.scheduler import SchedulerConfig
from maas_services.engine.settings import EngineSettings
from maas_services.engine.spec.config import SpecConfig
from maas_services.router.endpoints import Endpoint


def test_every_setting_lands_in_its_config_and_the_context_is_capped(tiny_config):
    settings = EngineSettings(
        model_id="m",
        max_model_len=10,
        max_num_seqs=3,
        max_num_batched_tokens=77,
        enable_chunked_prefill=False,
        prefix_cache_sharing="global",
        speculative_method="ngram",
        num_speculative_tokens=5,
        speculative_max_batch=6,
        speculative_draft_context=128,
    )
    engine, model = build_configs(settings, tiny_config, num_blocks=9)
    assert engine.scheduler == SchedulerConfig(
        max_num_seqs=3, max_num_batched_tokens=77, enable_chunked_prefill=False
    )
    assert engine.speculative == SpecConfig(
        method="ngram", num_tokens=5, max_batch=6, draft_context=128
    )
    assert (engine.num_blocks, engine.block_size, engine.max_model_len) == (9, BLOCK_SIZE, 10)
    assert (engine.cache_salt, engine.prefix_cache_sharing) == ("m", "global")
    assert model == dataclasses.replace(tiny_config, max_model_len=10)


def test_a_longer_setting_never_raises_the_models_context(tiny_config):
    engine, model = build_configs(EngineSettings(max_model_len=1000), tiny_config, 4)
    assert engine.max_model_len == model.max_model_len == tiny_config.max_model_len


def test_one_block_size_default_for_the_engine_and_the_router():
    assert EngineSettings().block_size == Endpoint("e", "a").block_size == BLOCK_SIZE
