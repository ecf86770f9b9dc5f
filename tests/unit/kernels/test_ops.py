"""The dispatch: on CPU tensors every op is its torch twin, and triton is never imported."""

import subprocess
import sys

import torch

from maas_kernels import ops
from maas_kernels.activation_ref import silu_and_mul_reference
from maas_kernels.ops import force_triton
from maas_kernels.paged_attention_ref import paged_attention_decode_reference
from maas_kernels.quant_int4_ref import int4_matmul_reference, quantize_int4
from maas_kernels.quant_int8_ref import int8_matmul_reference, quantize_int8
from maas_kernels.rms_norm_ref import rms_norm_residual_reference
from maas_kernels.rotary_ref import rotary_cos_sin_reference, rotary_embedding_reference
from tests.unit.kernels.triton_import import import_kernel


def assert_equal(actual, expected):
    if isinstance(expected, tuple):
        for a, e in zip(actual, expected, strict=True):
            assert torch.equal(a, e)
    else:
        assert torch.equal(actual, expected)


def test_cpu_tensors_take_the_torch_twins():
    torch.manual_seed(0)
    x, residual, weight = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)
    assert_equal(
        ops.rms_norm_residual(x, residual, weight, 1e-6),
        rms_norm_residual_reference(x, residual, weight, 1e-6),
    )
    gate_up = torch.randn(3, 32)
    assert_equal(ops.silu_and_mul(gate_up), silu_and_mul_reference(gate_up))
    q, k = torch.randn(3, 4, 8), torch.randn(3, 2, 8)
    cos, sin = rotary_cos_sin_reference(torch.arange(3), 8, 1e4, torch.float32)
    assert_equal(ops.rotary_embedding(q, k, cos, sin), rotary_embedding_reference(q, k, cos, sin))
    k_cache, v_cache = torch.randn(4, 2, 2, 8), torch.randn(4, 2, 2, 8)
    tables, lens = torch.tensor([[1, 3], [2, 0], [0, 0]]), torch.tensor([4, 1, 2])
    assert_equal(
        ops.paged_attention_decode(q, k_cache, v_cache, tables, lens),
        paged_attention_decode_reference(q, k_cache, v_cache, tables, lens),
    )
    w = torch.randn(8, 32)
    q8, scale = quantize_int8(w)
    assert_equal(ops.int8_matmul(gate_up, q8, scale), int8_matmul_reference(gate_up, q8, scale))
    packed, scales, mins = quantize_int4(w, 16)
    assert_equal(
        ops.int4_matmul(gate_up, packed, scales, mins, 16),
        int4_matmul_reference(gate_up, packed, scales, mins, 16),
    )


def test_cpu_serving_does_not_need_triton():
    code = (
        "import sys, torch\nfrom maas_kernels import ops\n"
        "ops.silu_and_mul(torch.randn(2, 8))\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_force_triton_sends_cpu_tensors_to_the_kernel_inside_the_block_only(monkeypatch):
    activation = import_kernel("activation")  # interpreted: conftest.py set TRITON_INTERPRET
    calls = []
    launcher = activation.silu_and_mul_triton
    monkeypatch.setattr(activation, "silu_and_mul_triton", lambda x: calls.append(x) or launcher(x))
    gate_up = torch.randn(3, 32)
    with force_triton():
        forced = ops.silu_and_mul(gate_up)
    assert len(calls) == 1
    torch.testing.assert_close(forced, silu_and_mul_reference(gate_up))
    ops.silu_and_mul(gate_up)
    assert len(calls) == 1
