"""The engine without a server: batch generation for tools and benchmarks.

`maas distill-draft` generates its training text this way and the
accelerator benchmark times decoding with it; both want continuous batching
and the same code path as serving, minus gRPC.
"""

import dataclasses

import torch
from tqdm import tqdm

from maas_services.common.text_tokenizer import TextTokenizer
from maas_services.engine.engine_config import build_configs
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.llm_engine import LLMEngine
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.model_runner import ModelRunner
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.settings import EngineSettings
from maas_services.engine.spec.config import SpecConfig


def offline_engine(
    model: LlamaForCausalLM,
    config: ModelConfig,
    tokenizer: TextTokenizer,
    max_num_seqs: int,
    max_model_len: int,
    speculative: SpecConfig | None = None,
    kv_dtype: torch.dtype | None = None,
) -> LLMEngine:
    """An engine whose KV pool (of kv_dtype, else the model's) holds max_num_seqs sequences
    of max_model_len at once."""
    settings = EngineSettings(max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    blocks = max_num_seqs * -(-max_model_len // settings.block_size)
    engine, config = build_configs(settings, config, blocks)
    if speculative is not None:
        # The benchmarks compare proposers set up in code, not by flags.
        engine = dataclasses.replace(engine, speculative=speculative)
    dtype = kv_dtype or model.dtype
    device = model.model.embed_tokens.weight.device
    cache = PagedKVCache.allocate(config, blocks, settings.block_size, dtype, device)
    return LLMEngine(engine, config, ModelRunner(model, config, cache, device), tokenizer)


@torch.inference_mode()
def generate(
    engine: LLMEngine,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    progress: str = "",
) -> list[list[int]]:
    """Each prompt's generated token ids, in prompt order (n = 1).

    With a progress label, a bar counts finished requests.
    """
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    for i, (prompt, p) in enumerate(zip(prompts, per_prompt, strict=True)):
        engine.add_request(str(i), prompt, p)
    outputs: list[list[int]] = [[] for _ in prompts]
    with tqdm(total=len(prompts), desc=progress, unit="seq", disable=not progress) as bar:
        while engine.has_work:
            for out in engine.step():
                outputs[int(out.request_id)] += out.token_ids
                bar.update(out.finish_reason is not None)
    return outputs
