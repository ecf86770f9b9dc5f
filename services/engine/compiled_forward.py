"""The compiled forward: torch.compile (inductor) of every decoder layer's dense halves.

A layer is dense work around paged attention (model.DecoderLayer): the
residual add and RMSNorm, the fused q/k/v projection and rotary before it; the
output projection, the next residual add and RMSNorm and the MLP after it
(on the CPU inductor traces through maas_kernels.ops into the torch twins). Paged
attention stays eager: its layout is data (block tables, one call per prefill
chunk) and it writes the pool in place. Each half compiles once into a graph every layer shares (the
layer's weights are inputs of the graph, not constants in it), with the token
count dynamic, so decode batches and prefill chunks of any size run the same
two graphs: no padding, no recompile while serving. Inductor specialises a
dimension of size 1, and the first layer has no residual stream yet (None),
so warm_up() compiles a single-token step and a many-token one, each with and
without a stream, before the engine takes requests.

Compiled artifacts live in inductor's FX graph cache under the model cache
(services/common/model_cache.py): a restart loads the kernels instead of
building them.

Eager is the default (--enforce-eager): on the 2-core AMD EPYC (avx2) the
float32 SmolLM2 step is bound by reading the weights, and the compiled halves
measured no faster (docs/engine.md, "Compiled forward", has the numbers).
"""

import functools
import os
import time

import torch

from services.common.logging import get_logger
from services.common.model_cache import cache_root
from services.engine.model import DecoderLayer, LlamaForCausalLM

log = get_logger(__name__)

# One step of a single token, then one of several: the two graphs each half needs.
WARM_UP_TOKENS = (1, 2)


def compile_forward(model: LlamaForCausalLM) -> None:
    """Route every layer's dense halves through torch.compile, then compile them."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    inputs = torch.compile(DecoderLayer.attention_inputs, dynamic=True)
    outputs = torch.compile(DecoderLayer.attention_outputs, dynamic=True)
    for layer in model.model.layers:
        layer.attention_inputs = functools.partial(inputs, layer)
        layer.attention_outputs = functools.partial(outputs, layer)
    warm_up(model)


@torch.inference_mode()
def warm_up(model: LlamaForCausalLM) -> None:
    config = model.config
    layer = model.model.layers[0]
    weight = layer.input_layernorm.weight
    for step, tokens in enumerate(WARM_UP_TOKENS, 1):
        started = time.perf_counter()
        x = torch.zeros(tokens, config.hidden_size, dtype=weight.dtype, device=weight.device)
        rotary = torch.ones(tokens, 1, config.head_dim, dtype=weight.dtype, device=weight.device)
        q, _, _, residual = layer.attention_inputs(x, None, rotary, rotary)  # the first layer
        layer.attention_inputs(x, residual, rotary, rotary)  # every other
        layer.attention_outputs(q, residual)
        log.info(
            "engine_compile_progress",
            step=f"{step}/{len(WARM_UP_TOKENS)}",
            tokens=tokens,
            seconds=round(time.perf_counter() - started, 1),
            cache=os.environ["TORCHINDUCTOR_CACHE_DIR"],
        )
