"""A float32 model's weights as its GGUF checkpoint stores them, for its narrow steps.

A float32 engine loaded from a GGUF file holds each weight dequantized: the file's
Q4_0/Q4_1 projections and Q8_0 head widened to float32, 4 bytes a weight. A decode
step of a few rows is bound by reading them (SmolLM2-135M: ~540 MB a token). The
file's own blocks hold the same weights in an eighth (int4) or a quarter (int8)
of the bytes, so the native path (native_layers.py) keeps them beside the float32
weights and multiplies narrow steps by them, float32 activations and all
(--narrow-weights checkpoint): the served weights do not change, only the order
of the sums, as between float32's own row kernel and panel GEMM. Wide steps,
compute-bound, keep the float32 weights and their panel GEMM, which the blocks
would have to be dequantized for on every call.

Measured on SmolLM2 (AMD EPYC family 25 model 1, Zen 3, avx2, 2 threads): the
blocks' row kernels against float32's over the 30 layers' shapes at 1 / 2 / 4 /
6 / 8 rows (an ad-hoc harness over native/matmul.cpp, median of 5 rounds): int4
layers 3.1x / 2.6x / 1.55x / 1.14x / 1.10x, the Q8_0 head 2.9x / 2.8x / 2.1x /
1.7x / 1.6x; whole decode steps (`python -m benchmarks.step_bench --narrow-ab
--threads 2`), float32's wall time over the blocks' 3.3x / 2.9x / 2.1x / 1.36x at
1 / 2 / 4 / 6 rows and 1.27x at 7, 1.34x at 8; from 9 rows the row kernels take
three passes over the weights and the float32 panel GEMM wins.
"""

from pathlib import Path

import torch
from torch import nn

from maas_services.engine.model import FusedLinear, LlamaForCausalLM
from maas_services.engine.quantization.file_blocks import file_blocks
from maas_services.engine.quantization.int4 import Int4Weight
from maas_services.engine.quantization.int8 import Int8Weight

# Rows up to which a step reads the blocks instead of the float32 weights.
NARROW_ROWS = 8

CheckpointBlock = Int4Weight | Int8Weight


def checkpoint_blocks(
    model: LlamaForCausalLM, source: str | Path
) -> dict[nn.Module, CheckpointBlock]:
    """The float32 model's linear modules (the head: the embedding, where tied) whose
    weights the GGUF file at source stores as Q4_0/Q4_1 (projections) or Q8_0 (head)
    blocks, each with those blocks; empty for a folder, another file's types or a model
    not in float32 on the CPU."""
    embedding = model.model.embed_tokens.weight
    if embedding.device.type != "cpu" or embedding.dtype != torch.float32:
        return {}
    if not Path(source).is_file():
        return {}
    found = file_blocks(model, Path(source))
    blocks: dict[nn.Module, CheckpointBlock] = {}
    for name, weight in found.projections.items():
        module = model.get_submodule(name)
        if type(module) in (nn.Linear, FusedLinear):
            blocks[module] = weight
    float_head = model.lm_head is None or type(model.lm_head) is nn.Linear
    if found.head is not None and float_head:
        head = model.model.embed_tokens if model.lm_head is None else model.lm_head
        blocks[head] = found.head
    return blocks
