"""Quantized weights taken from a GGUF file's blocks as they are, with no requantization.

int4 from Q4_0/Q4_1, both grouping 32 inputs. Q4_1 stores a float16 scale d and
minimum m per block and weight = level * d + m, which is our int4 arithmetic;
Q4_0 stores only d and weight = (level - 8) * d, which is the same with m = -8d.
Only the nibble order differs: a block keeps element j in the low nibble of its
byte j and element j + 16 in the high nibble; ours pairs 2j with 2j + 1.

int8 from Q8_0 (llama.cpp's usual type for the output matrix, SmolLM2's tied
embedding among them): a float16 scale d and 32 int8 values q per block,
weight = q * d, which is Int8Weight with a scale per group of 32. q * d is exact in
float32 (8 bits times 11), so the layer holds bit for bit the weights the file's
float dequantization gives.
"""

from collections import defaultdict
from collections.abc import Container, Mapping
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader

from maas_services.engine.gguf_loader import (
    _PERMUTED_ARCHITECTURES,
    _our_name,
    _unpermute_rotary_rows,
)
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.quantization.int4 import Int4Weight
from maas_services.engine.quantization.int8 import Int8Weight

GROUP_SIZE = 32
_BLOCK_BYTES = {GGMLQuantizationType.Q4_0: 18, GGMLQuantizationType.Q4_1: 20}
_Q8_0_BLOCK_BYTES = 34


def _reader(source: str | Path | GGUFReader) -> GGUFReader:
    """source's reader: parsing a file's metadata takes seconds (its vocabulary), so a
    caller that reads several things opens it once and passes the reader."""
    return source if isinstance(source, GGUFReader) else GGUFReader(source)


def read_int4_blocks(
    path: str | Path | GGUFReader,
    config: ModelConfig,
    packed_modules_mapping: Mapping[str, tuple[str, int]],
    modules: Container[str],
) -> dict[str, Int4Weight]:
    """Int4 weights of the modules (by our name, fused) whose every checkpoint part is Q4_0/Q4_1.

    modules holds the last name component of the modules wanted (qkv_proj,
    down_proj ...). A fused projection with one part in another type (a mixed
    quantization) is left out: the caller quantizes it from floats instead.
    """
    parts_per_module = defaultdict(int)
    for fused, _ in packed_modules_mapping.values():
        parts_per_module[fused] += 1
    parts: dict[str, dict[int, Int4Weight]] = defaultdict(dict)
    for tensor in _reader(path).tensors:
        name = _our_name(tensor.name)
        if tensor.tensor_type not in _BLOCK_BYTES or not name.endswith(".weight"):
            continue
        parent, _, module = name.removesuffix(".weight").rpartition(".")
        fused, shard = packed_modules_mapping.get(module, (module, 0))
        if fused not in modules:
            continue
        weight = _from_blocks(np.array(tensor.data), tensor.tensor_type)
        if config.architecture in _PERMUTED_ARCHITECTURES and module in ("q_proj", "k_proj"):
            heads = config.num_heads if module == "q_proj" else config.num_kv_heads
            rows = (weight.packed, weight.scales, weight.mins)
            weight = Int4Weight(*(_unpermute_rotary_rows(t, heads) for t in rows), GROUP_SIZE)
        parts[f"{parent}.{fused}"][shard] = weight
    return {
        name: Int4Weight.cat([shards[i] for i in sorted(shards)])
        for name, shards in parts.items()
        if len(shards) == parts_per_module.get(name.rpartition(".")[2], 1)
    }


def _from_blocks(data: np.ndarray, kind: GGMLQuantizationType) -> Int4Weight:
    """uint8 [N, blocks * block bytes], one row of blocks per output row -> our format."""
    rows = data.shape[0]
    blocks = torch.from_numpy(data).view(rows, -1, _BLOCK_BYTES[kind])
    scales = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    if kind == GGMLQuantizationType.Q4_1:
        mins = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
        nibbles = blocks[..., 4:]
    else:
        mins = -8 * scales
        nibbles = blocks[..., 2:]
    # Elements 2i and 2i + 1 sit in bytes 2i and 2i + 1 of the block: in their low
    # nibbles for the first 16 elements, in their high nibbles for the last 16.
    even, odd = nibbles[..., 0::2], nibbles[..., 1::2]
    packed = torch.cat(((even & 0xF) | (odd << 4), (even >> 4) | (odd & 0xF0)), dim=-1)
    return Int4Weight(packed.view(rows, -1), scales, mins, GROUP_SIZE)


def read_int8_head(path: str | Path | GGUFReader, tied: bool) -> Int8Weight | None:
    """The LM head (tied: the token embedding) as the file's Q8_0 blocks, or None where the
    file stores it in another type, or holds a -128 (the int8 kernels' levels stop at -127).
    """
    name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    tensor = next((t for t in _reader(path).tensors if _our_name(t.name) == name), None)
    if tensor is None or tensor.tensor_type != GGMLQuantizationType.Q8_0:
        return None
    data = torch.from_numpy(np.array(tensor.data))
    blocks = data.view(data.shape[0], -1, _Q8_0_BLOCK_BYTES)
    scales = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    q = blocks[..., 2:].contiguous().view(torch.int8).reshape(data.shape[0], -1)
    if bool((q == -128).any()):
        return None
    return Int8Weight(q, scales, GROUP_SIZE)
