import pytest
import torch

from maas_kernels.rms_norm_ref import rms_norm_residual_reference
from tests.unit.kernels.tolerances import assert_close, assert_rounds_like
from tests.unit.kernels.triton_import import import_kernel

rms_norm = import_kernel("rms_norm")

EPS = 1e-5
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(rows, hidden, generator=gen).to(dtype) for _ in range(2))
    weight = (1 + 0.5 * torch.randn(hidden, generator=gen)).to(dtype)
    return x, residual, weight


def transformers_norm(weight: torch.Tensor):
    """transformers' Llama RMSNorm with this weight: the arithmetic the engine must round like."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(weight.shape[0], EPS).to(weight.dtype)
    norm.weight.data.copy_(weight)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_twin_is_a_residual_add_then_transformers_rmsnorm(dtype):
    x, residual, weight = inputs(4, 48, dtype)
    normed, new_residual = rms_norm_residual_reference(x, residual, weight, EPS)
    # A decoder layer: the stream plus the sublayer's output, then the next norm.
    stream = residual + x
    with torch.no_grad():
        expected = transformers_norm(weight)(stream)
    assert torch.equal(new_residual, stream)
    assert torch.equal(normed, expected)


def test_the_twin_without_a_residual_is_transformers_rmsnorm():
    x, _, weight = inputs(4, 48, torch.bfloat16)
    normed, new_residual = rms_norm_residual_reference(x, None, weight, EPS)
    with torch.no_grad():
        assert torch.equal(normed, transformers_norm(weight)(x))
    assert new_residual is x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden", [(1, 64), (5, 100), (3, 576)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_the_kernel_matches_its_twin(dtype, rows, hidden, with_residual):
    x, residual, weight = inputs(rows, hidden, dtype)
    residual = residual if with_residual else None
    normed, new_residual = rms_norm.rms_norm_residual_triton(x, residual, weight, EPS)
    expected_normed, expected_residual = rms_norm_residual_reference(x, residual, weight, EPS)
    assert_close(new_residual, expected_residual)
    assert_close(normed, expected_normed)
    if residual is None:
        assert new_residual is x


def test_the_kernel_rounds_where_its_twin_rounds():
    x, residual, weight = inputs(16, 576, torch.float16)
    normed, _ = rms_norm.rms_norm_residual_triton(x, residual, weight, EPS)
    assert_rounds_like(normed, rms_norm_residual_reference(x, residual, weight, EPS)[0])


def test_the_kernel_reads_rows_of_a_wider_tensor_and_keeps_leading_dimensions():
    x, residual, weight = inputs(6, 80, torch.float32)
    # [2, 3, 40] views whose rows are 80 apart: halves of a wider projection.
    x_view = x[:, :40].view(2, 3, 40)
    residual_view = residual[:, 40:].view(2, 3, 40)
    normed, new_residual = rms_norm.rms_norm_residual_triton(
        x_view, residual_view, weight[:40], EPS
    )
    expected = rms_norm_residual_reference(x_view, residual_view, weight[:40], EPS)
    assert normed.shape == new_residual.shape == (2, 3, 40)
    assert_close(normed, expected[0])
    assert_close(new_residual, expected[1])


def test_the_kernel_leaves_its_inputs_alone():
    x, residual, weight = inputs(3, 64, torch.float32)
    before = x.clone(), residual.clone()
    rms_norm.rms_norm_residual_triton(x, residual, weight, EPS)
    assert torch.equal(x, before[0])
    assert torch.equal(residual, before[1])
