"""benchmarks/library_ab.py: another revision's kernels built beside this tree's and timed
against them in one process on the same activations."""

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks.library_ab import (
    REPOSITORY,
    attention_pass,
    base_library,
    compare,
    linear_pass,
)
from maas_kernels.native import bindings
from maas_kernels.native import library as native
from maas_kernels.quant_int4_ref import dequantize_int4, quantize_int4
from maas_services.engine.native_layers import NativeHead, wide_bf16_kernel
from maas_services.engine.quantization.int4 import Int4Weight

pytestmark = pytest.mark.skipif(
    bindings.library() is None
    or native.find_compiler() is None
    or shutil.which("git") is None
    or not (REPOSITORY / ".git").exists(),
    reason="needs the native library, a C++ compiler and a git checkout",
)


def kernels_committed() -> bool:
    """Whether this tree's kernels are HEAD's (then both builds must agree bit for bit)."""
    diff = ["git", "diff", "--quiet", "HEAD", "--", "kernels/native"]
    return subprocess.run(diff, cwd=REPOSITORY).returncode == 0


def test_head_built_beside_this_tree_times_both_on_the_same_rows(tmp_path: Path):
    base = base_library("HEAD", tmp_path)
    assert (tmp_path / "kernels" / "native" / "matmul.cpp").is_file()
    generator = torch.Generator().manual_seed(0)
    bf16 = bool(wide_bf16_kernel())
    # Weights as the engine describes them (a head is one weight): float32 or its bf16
    # copy, and one with its blocks too (the narrow steps' kernels).
    heads = [NativeHead(torch.randn(n, 576, generator=generator), bf16, None) for n in (96, 200)]
    dense = torch.randn(40, 576, generator=generator)
    block = Int4Weight(*quantize_int4(dense, 32), 32)
    heads.append(
        NativeHead(
            dequantize_int4(block.packed, block.scales, block.mins, 32), bf16, block, int16=True
        )
    )
    weights = [head.weight for head in heads]
    # 8 rows: the blocks' kernel; 40: the panel's wide tile (bf16) or outer-product tile
    # (float32), and a tail.
    builds = {"base": base, "this": bindings.library()}
    passes = [linear_pass(weights, rows, threads=1) for rows in (8, 40)]
    # And decode attention: 3 decodes of 20 positions (a whole block and part of one)
    # over two layers' bf16 pools, SmolLM2's heads.
    passes.append(attention_pass(2, 3, 20, torch.bfloat16))
    for one_pass in passes:
        result = compare(builds, one_pass, rounds=2)
        assert result["base_ms"] > 0 and result["this_ms"] > 0 and result["base_over_this"] > 0
        if kernels_committed():
            assert result["same_bits"]
