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
from gguf import GGUFReader
from safetensors.torch import load_file, save_file
from torch import nn

from maas_services.common.model_cache import derived_folder, publish
from maas_services.engine.model import FusedLinear, LlamaForCausalLM
from maas_services.engine.quantization import gguf_blocks
from maas_services.engine.quantization.gguf_blocks import GROUP_SIZE
from maas_services.engine.quantization.int4 import Int4Weight
from maas_services.engine.quantization.int8 import Int8Weight
from maas_services.engine.quantization.quantize import TARGETS

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
    blocks: dict[nn.Module, CheckpointBlock] = {}
    tensors = _cached(model, Path(source))
    for name in {key.rpartition(".")[0] for key in tensors}:
        if name == _HEAD:
            continue
        module = model.get_submodule(name)
        weight = Int4Weight(*(tensors[f"{name}.{part}"] for part in _INT4_PARTS), GROUP_SIZE)
        if type(module) in (nn.Linear, FusedLinear) and _fits(weight, module.weight.shape):
            blocks[module] = weight
    float_head = model.lm_head is None or type(model.lm_head) is nn.Linear
    head = model.model.embed_tokens if model.lm_head is None else model.lm_head
    if f"{_HEAD}.q" in tensors and float_head:
        q8 = Int8Weight(tensors[f"{_HEAD}.q"], tensors[f"{_HEAD}.scale"], GROUP_SIZE)
        if _fits(q8, head.weight.shape):
            blocks[head] = q8
    return blocks


def _fits(block: CheckpointBlock, shape: torch.Size) -> bool:
    """Whether every array of the block has the shape the kernels will read for a weight of
    this shape (a cached file is read back as it lies: a stale one must not be trusted)."""
    n, k = shape
    groups = (n, k // GROUP_SIZE)
    if isinstance(block, Int8Weight):
        return block.q.shape == shape and block.scale.shape == groups
    return block.packed.shape == (n, k // 2) and block.scales.shape == block.mins.shape == groups


# The blocks as one safetensors file beside the model's derived folder
# (common/model_cache.py), in a subfolder: the folder's own *.safetensors are the
# model's weights, which the loader and vLLM read whole. Reading the blocks from the
# GGUF parses its metadata (~5 s for SmolLM2's vocabulary), which every engine start
# would pay; the file loads in a fraction of a second. Keys: a fused module's name +
# ".packed" / ".scales" / ".mins", and the head's "head.q" / "head.scale".
_CACHE_FOLDER = "checkpoint-blocks"
_CACHE_FILE = "blocks.safetensors"
_HEAD = "head"
_INT4_PARTS = ("packed", "scales", "mins")


def _cached(model: LlamaForCausalLM, source: Path) -> dict[str, torch.Tensor]:
    folder = derived_folder(source) / _CACHE_FOLDER
    if (folder / _CACHE_FILE).is_file():
        return load_file(folder / _CACHE_FILE)
    reader = GGUFReader(source)
    tensors: dict[str, torch.Tensor] = {}
    projections = gguf_blocks.read_int4_blocks(
        reader, model.config, model.packed_modules_mapping, TARGETS
    )
    for name, weight in projections.items():
        for part in _INT4_PARTS:
            tensors[f"{name}.{part}"] = getattr(weight, part).contiguous()
    # The file's layout, not the model's modules (a quantized head is no longer tied): the
    # cache serves every later engine of this file.
    head = gguf_blocks.read_int8_head(reader, tied=model.config.tie_word_embeddings)
    if head is not None:
        tensors[f"{_HEAD}.q"], tensors[f"{_HEAD}.scale"] = head.q, head.scale.contiguous()
    publish(folder, _CACHE_FILE, lambda path: save_file(tensors, path))
    return tensors
