"""A float32 model's weights as its GGUF checkpoint stores them, for its decode steps.

A float32 engine loaded from a GGUF file holds each weight dequantized: the file's
Q4_0/Q4_1 projections and Q8_0 head widened to float32, 4 bytes a weight. A decode
step of a few rows is bound by reading them (SmolLM2-135M: ~540 MB a token). The
file's own blocks hold the same weights in an eighth (int4) or a quarter (int8)
of the bytes, so the native path (native_layers.py) keeps them beside the float32
weights and multiplies steps of up to BLOCKS_ROWS rows by them, float32
activations and all (--kernel-weights checkpoint): up to BLOCKS_ROW_KERNEL_ROWS
rows through their row kernels, wider ones through the panel GEMM, which
dequantizes each panel into float32 in L2 (level * scale + min is exact in
float32 for the file's float16 scales, so a panel step's sums are the float32
weights' bit for bit) where the float32 weights' panel would be read from
memory. The served weights do not change; a row-kernel step's sums differ only
in order, as between float32's own row kernel and panel GEMM. Steps wider than
BLOCKS_ROWS (large decode batches, prefill) read the float32 weights: there the
packed activations (64 rows x 1536 inputs: 393 KB) and the dequantized panel
(128 KB) no longer fit a 512 KB L2 together, and the two measured even.
Beside a weight's bf16 copy (--wide-gemm bf16) the blocks serve steps of up to
BF16_BLOCKS_ROWS rows instead, all through an int16 kernel over a copy of them
with 8 output rows interleaved (native_layers._cols8), and wider steps read the
bf16 copy (docs/engine.md, "The blocks beside bf16 copies"). With --wide-gemm
int8 they serve every step instead of a bf16 copy, on activations rounded to
int8, through a copy with 16 output rows interleaved (native_layers._cols16).

Measured on SmolLM2 (AMD EPYC family 25 model 1, Zen 3, avx2, 2 threads), session
25: all 121 weights (ad-hoc harness over native/matmul.cpp's C entries, the real
blocks, alternating sides, median of 8) float32's time over the blocks' 3.2x at 1
row, 1.48x at 8 (row kernel), 1.33x / 1.18x / 1.12x / 1.10x / 1.04x at 9 / 16 /
24 / 32 / 64 (panel), ~1.0x at 512-662 (prefill); the blocks' row kernel over
their panel 1.9x / 1.2x / 1.05x at 2 / 6 / 8 rows and 0.87x at 9, hence 8. Whole
decode steps (`python -m benchmarks.step_bench --blocks-ab --threads 2`) 1.04x to
1.26x at 9-32 rows (five runs), 1.01x to 1.08x at 64 (docs/engine.md), hence 32.
"""

from pathlib import Path

import torch
from torch import nn

from maas_services.engine.model import FusedLinear, LlamaForCausalLM
from maas_services.engine.quantization.file_blocks import file_blocks
from maas_services.engine.quantization.int4 import Int4Weight
from maas_services.engine.quantization.int8 import Int8Weight

# Rows up to which a step reads the blocks (the float32 weights above), and up to which
# it runs their row kernel (their panel GEMM above).
BLOCKS_ROWS = 32
BLOCKS_ROW_KERNEL_ROWS = 8
# Beside a weight's bf16 copy (--wide-gemm bf16), rows up to which a step reads the blocks,
# all through the row kernel (int16 activations: the interleaved layout's, matmul.h);
# wider ones read the copy. Decode steps, the blocks over the copy (AMD EPYC family 25
# model 17, Zen 4, avx512_bf16 + avx512_vnni; session 30, docs/engine.md): 2.15x / 2.18x /
# 1.87x / 1.54x / 1.29x / 1.22x faster at 1 / 4 / 6 / 8 / 10 / 12 rows, 0.94x at 16.
BF16_BLOCKS_ROWS = 12
# With --wide-gemm int8 every step reads the blocks (qdot.cpp's int8 kernel, cols16_qdot).
EVERY_STEP = 1 << 62

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
    found = file_blocks(model, source)
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
