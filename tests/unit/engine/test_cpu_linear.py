"""The LM head's float32 matmul on the CPU: row slices equal one F.linear bit for bit,
and the native panel GEMM (many rows) equals it within float32 rounding."""

import pytest
import torch
import torch.nn.functional as F

from maas_kernels.native import bindings
from maas_services.engine import cpu_linear


def _case(rows: int, with_bias: bool):
    generator = torch.Generator().manual_seed(rows)
    # 3,100 rows: four full slices and a short last one.
    weight = torch.randn(3100, 576, generator=generator)
    bias = torch.randn(3100, generator=generator) if with_bias else None
    return torch.randn(rows, 576, generator=generator), weight, bias


@pytest.mark.parametrize("rows", [1, 8, 33, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_sliced_wide_weight_equals_one_matmul(rows, with_bias):
    x, weight, bias = _case(rows, with_bias)
    assert torch.equal(cpu_linear.sliced(x, weight, bias), F.linear(x, weight, bias))


@pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)
@pytest.mark.parametrize("rows", [5, 8, 33, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_many_rows_run_the_native_gemm_and_equal_one_matmul(rows, with_bias):
    x, weight, bias = _case(rows, with_bias)
    assert cpu_linear._native(x, weight, bias)
    torch.testing.assert_close(
        cpu_linear.linear(x, weight, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4
    )


def test_few_rows_training_and_no_library_keep_the_slices(monkeypatch):
    x, weight, _ = _case(4, False)
    assert not cpu_linear._native(x, weight, None)
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))
    x, weight, _ = _case(64, False)
    weight.requires_grad_()
    assert not cpu_linear._native(x, weight, None)  # a draft model in training
    with torch.no_grad():
        assert cpu_linear._native(x, weight, None)
    monkeypatch.setattr(bindings, "library", lambda: None)
    weight.requires_grad_(False)
    assert torch.equal(cpu_linear.linear(x, weight), F.linear(x, weight))


@pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)
@pytest.mark.parametrize("rows", [17, 23, 25, 30])
def test_a_wide_calls_last_rows_take_the_dot_form_not_zero_rows(rows):
    """The panel GEMM's outer tiles take a wide call's rows in whole vectors of 8, each
    output summed in input order (so a row's sums are any tiled call's), and its last
    rows % 8 the dot form, as a narrow call's rows, instead of zero rows padding a
    vector; 29-31 rows are padded to a tile of 32 (matmul.cpp's tiled_rows)."""
    x, weight, _ = _case(rows, False)
    out = cpu_linear.linear(x, weight)
    if rows % 16 >= 13:
        padded = torch.cat([x, torch.zeros(32 - rows, x.shape[1])])
        assert torch.equal(out, cpu_linear.linear(padded, weight)[:rows])
        return
    tiled = rows // 8 * 8
    assert torch.equal(out[:tiled], cpu_linear.linear(x[:tiled], weight))
    narrow = cpu_linear.linear(x[rows - 8 :], weight)  # 8 rows: the dot form
    assert torch.equal(out[tiled:], narrow[8 - (rows - tiled) :])
