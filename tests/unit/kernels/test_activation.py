import pytest
import torch

from maas_kernels.activation_ref import silu_and_mul_reference
from maas_services.engine.model import MLP
from maas_services.engine.model_config import ModelConfig
from tests.unit.kernels.tolerances import assert_close, assert_rounds_like
from tests.unit.kernels.triton_import import import_kernel

activation = import_kernel("activation")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_the_twin_is_the_engines_mlp_activation():
    size = 24
    config = ModelConfig(
        architecture="llama",
        vocab_size=8,
        hidden_size=size,
        intermediate_size=size,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=12,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        max_model_len=8,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    mlp = MLP(config)
    torch.nn.init.normal_(mlp.gate_up_proj.weight)
    # An identity down projection leaves the activation itself as the output.
    mlp.down_proj.weight.data.copy_(torch.eye(size))
    x = torch.randn(5, size)
    with torch.no_grad():
        expected = mlp(x)
        actual = silu_and_mul_reference(mlp.gate_up_proj(x))
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("dtype", DTYPES)
# 1100 columns: two programs per row, the second one mostly masked.
@pytest.mark.parametrize("rows, intermediate", [(1, 8), (3, 100), (2, 1100)])
def test_the_kernel_matches_its_twin(dtype, rows, intermediate):
    gen = torch.Generator().manual_seed(rows)
    x = (3 * torch.randn(rows, 2 * intermediate, generator=gen)).to(dtype)
    assert_close(activation.silu_and_mul_triton(x), silu_and_mul_reference(x))


def test_the_kernel_rounds_where_its_twin_rounds():
    x = (3 * torch.randn(16, 1024, generator=torch.Generator().manual_seed(0))).half()
    assert_rounds_like(activation.silu_and_mul_triton(x), silu_and_mul_reference(x))


def test_the_kernel_keeps_leading_dimensions_and_reads_strided_rows():
    wide = torch.randn(2, 3, 50)
    x = wide[..., :40]  # rows 50 apart
    out = activation.silu_and_mul_triton(x)
    assert out.shape == (2, 3, 20)
    assert_close(out, silu_and_mul_reference(x))


def test_the_kernel_refuses_an_odd_width():
    with pytest.raises(ValueError, match="two equal halves"):
        activation.silu_and_mul_triton(torch.randn(2, 7))
