"""The compiled compute path: torch.compile (inductor) of every decoder layer's dense halves.

A layer is dense work around paged attention (model.DecoderLayer): the
residual add and RMSNorm, the fused q/k/v projection and rotary before it; the
output projection, the next residual add and RMSNorm and the MLP after it
(on the CPU inductor traces through maas_kernels.ops into the torch twins). Paged
attention stays eager: its layout is data (block tables, one call per prefill
chunk) and it writes the pool in place. Each half compiles once into a graph
every layer shares (the layer, hence its weights, is an input of the graph, not
constants in it), with the token
count dynamic, so decode batches and prefill chunks of any size run the same
two graphs: no padding, no recompile while serving. Inductor specialises a
dimension of size 1, and the first layer has no residual stream yet (None),
so Compiled compiles a single-token step and a many-token one, each with and
without a stream, when it is built, before the engine takes requests.

A step with LoRA adapter rows runs the layers' own (eager) methods: the graphs
are traced without adapters, and a graph per set of adapters would recompile
while serving.

Compiled artifacts live in inductor's FX graph cache under the model cache
(services/common/model_cache.py): a restart loads the kernels instead of
building them.

Eager is the default (--enforce-eager): on the 2-core AMD EPYC (avx2) the
float32 SmolLM2 step is bound by reading the weights, and the compiled halves
measured no faster (docs/engine.md, "Compiled forward", has the numbers).
"""

import os
import time

import torch

from maas_services.common.logging import get_logger
from maas_services.common.model_cache import cache_root
from maas_services.engine.compute_path import ComputePath
from maas_services.engine.lora.step_lora import LayerLora
from maas_services.engine.model import DecoderLayer, LlamaForCausalLM

log = get_logger(__name__)

# One step of a single token, then one of several: the two graphs each half needs.
WARM_UP_TOKENS = (1, 2)


class Compiled(ComputePath):
    """The layers' dense halves through torch.compile: two graphs, shared by every layer."""

    name = "compiled"

    def __init__(self, model: LlamaForCausalLM, reason: str):
        super().__init__(reason)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
        self._inputs = torch.compile(DecoderLayer.attention_inputs, dynamic=True)
        self._outputs = torch.compile(DecoderLayer.attention_outputs, dynamic=True)
        self._warm_up(model)

    def attention_inputs(
        self,
        layer: DecoderLayer,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if lora is not None:
            return layer.attention_inputs(x, residual, cos, sin, lora)
        return self._inputs(layer, x, residual, cos, sin)

    def attention_outputs(
        self,
        layer: DecoderLayer,
        attended: torch.Tensor,
        residual: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if lora is not None:
            return layer.attention_outputs(attended, residual, lora)
        return self._outputs(layer, attended, residual)

    @torch.inference_mode()
    def _warm_up(self, model: LlamaForCausalLM) -> None:
        config = model.config
        layer = model.model.layers[0]
        weight = layer.input_layernorm.weight
        for step, tokens in enumerate(WARM_UP_TOKENS, 1):
            started = time.perf_counter()
            x = torch.zeros(tokens, config.hidden_size, dtype=weight.dtype, device=weight.device)
            rotary = torch.ones(
                tokens, 1, config.head_dim, dtype=weight.dtype, device=weight.device
            )
            q, _, _, residual = self.attention_inputs(layer, x, None, rotary, rotary)  # the first
            self.attention_inputs(layer, x, residual, rotary, rotary)  # every other layer
            self.attention_outputs(layer, q, residual)
            log.info(
                "engine_compile_progress",
                step=f"{step}/{len(WARM_UP_TOKENS)}",
                tokens=tokens,
                seconds=round(time.perf_counter() - started, 1),
                cache=os.environ["TORCHINDUCTOR_CACHE_DIR"],
            )
