"""Drive one sequence through prefill and decode, a token per step."""

from dataclasses import dataclass, field

import torch

from services.engine.kv_cache import KVCache
from services.engine.model import LlamaForCausalLM
from services.engine.model_config import ModelConfig
from services.engine.sampler import Sampler, make_generator
from services.engine.sampling_params import SamplingParams


@dataclass
class SequenceState:
    prompt_ids: list[int]
    params: SamplingParams
    cache: KVCache  # owned here alone: dropping the state frees it
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)

    def finish_reason(self, config: ModelConfig) -> str | None:
        """'stop' for an end-of-turn or stop token, 'length' when out of budget or room."""
        if not self.output_ids:
            return None
        last = self.output_ids[-1]
        if last in self.params.stop_token_ids:
            return "stop"
        if not self.params.ignore_eos and last in config.eos_token_ids:
            return "stop"
        if len(self.output_ids) >= self.params.max_tokens:
            return "length"
        if len(self.prompt_ids) + len(self.output_ids) >= config.max_model_len:
            return "length"
        return None


class Generator:
    def __init__(
        self, model: LlamaForCausalLM, config: ModelConfig, device: torch.device | str = "cpu"
    ):
        self.model = model
        self.config = config
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.sampler = Sampler(config.eos_token_ids)

    def start(self, prompt_ids: list[int], params: SamplingParams) -> SequenceState:
        params.validate()
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) >= self.config.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens, "
                f"the model takes at most {self.config.max_model_len - 1}"
            )
        vocab = self.config.vocab_size
        if not all(0 <= i < vocab for i in prompt_ids):
            raise ValueError(f"prompt_ids must be in [0, {vocab})")
        if not all(i < vocab for i in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be < {vocab}")
        # The last sampled token is never fed back, so it needs no cache slot.
        capacity = min(len(prompt_ids) + params.max_tokens - 1, self.config.max_model_len)
        return SequenceState(
            prompt_ids=list(prompt_ids),
            params=params,
            cache=KVCache.allocate(self.config, capacity, self.dtype, self.device),
            generator=make_generator(params.seed, self.device),
        )

    @torch.inference_mode()
    def step(self, state: SequenceState) -> int:
        if state.finish_reason(self.config) is not None:
            raise RuntimeError("the sequence has already finished")
        new_ids = state.prompt_ids if state.cache.length == 0 else state.output_ids[-1:]
        input_ids = torch.tensor(new_ids, dtype=torch.long, device=self.device)
        hidden = self.model(input_ids, [state.cache], [len(new_ids)])
        logits = self.model.compute_logits(hidden[-1])
        token = self.sampler(logits, [state])[0]
        state.output_ids.append(token)
        return token
