"""benchmarks/library_ab.py: another revision's kernels built beside this tree's and timed
against them in one process on the same activations."""

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks.library_ab import REPOSITORY, base_library, cols8_weight, compare, native_weight
from maas_kernels.native import bindings
from maas_kernels.native import library as native
from maas_kernels.quant_int4_ref import quantize_int4
from maas_services.engine.native_layers import wide_bf16_kernel
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
    kept: list = []
    weights = [
        native_weight(torch.randn(n, 576, generator=generator), bool(wide_bf16_kernel()), kept)
        for n in (96, 200)
    ]
    # The narrow steps' interleaved blocks too (int16 activations).
    blocks = Int4Weight(*quantize_int4(torch.randn(40, 576, generator=generator), 32), 32)
    weights.append(cols8_weight(blocks, kept))
    # 40 rows: the panel's wide tile (bf16) or outer-product tile (float32), and a tail.
    result = compare({"base": base, "this": bindings.library()}, weights, 40, 2, 1)
    assert result["base_ms"] > 0 and result["this_ms"] > 0 and result["base_over_this"] > 0
    if kernels_committed():
        assert result["same_bits"]
