import pytest
import torch

from maas_kernels.rotary_ref import rotary_cos_sin_reference, rotary_embedding_reference
from tests.unit.kernels.tolerances import assert_close, assert_rounds_like
from tests.unit.kernels.triton_import import import_kernel

rotary = import_kernel("rotary")

THETA = 1e5  # SmolLM2's
# Far positions too: the angle reaches 1e5 radians, where float32 care matters.
POSITIONS = torch.tensor([0, 1, 2, 17, 255, 256, 1000, 4095, 32767, 99999])
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def qk(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """q and k as the engine has them: strided views into one fused qkv projection."""
    gen = torch.Generator().manual_seed(heads * head_dim)
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    qkv = torch.randn(tokens, sum(sizes), generator=gen).to(dtype)
    q, k, _ = qkv.split(sizes, dim=-1)
    return q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_twin_is_transformers_rotary(dtype):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = qk(len(POSITIONS), 9, 3, 64, dtype)
    cos, sin = rotary_cos_sin_reference(POSITIONS, 64, THETA, dtype)
    q_out, k_out = rotary_embedding_reference(q, k, cos, sin)
    # transformers' cos and sin are [tokens, head_dim]; it adds the heads dimension itself.
    expected = apply_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0], unsqueeze_dim=1)
    assert torch.equal(q_out, expected[0])
    assert torch.equal(k_out, expected[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim",
    [
        (9, 3, 64),  # SmolLM2-135M
        (4, 4, 8),  # no grouping
        (6, 1, 24),  # half of head_dim (12) not a power of two
    ],
)
def test_the_kernel_matches_its_twin(dtype, heads, kv_heads, head_dim):
    q, k = qk(len(POSITIONS), heads, kv_heads, head_dim, dtype)
    cos, sin = rotary_cos_sin_reference(POSITIONS, head_dim, THETA, dtype)
    q_out, k_out = rotary.rotary_embedding_triton(q, k, cos, sin)
    expected_q, expected_k = rotary_embedding_reference(q, k, cos, sin)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    assert_close(q_out, expected_q)
    assert_close(k_out, expected_k)


def test_the_kernel_rounds_where_its_twin_rounds():
    q, k = qk(len(POSITIONS), 9, 3, 64, torch.float16)
    cos, sin = rotary_cos_sin_reference(POSITIONS, 64, THETA, torch.float16)
    q_out, k_out = rotary.rotary_embedding_triton(q, k, cos, sin)
    expected_q, expected_k = rotary_embedding_reference(q, k, cos, sin)
    assert_rounds_like(q_out, expected_q)
    assert_rounds_like(k_out, expected_k)


def test_the_kernel_leaves_q_and_k_alone():
    q, k = qk(4, 2, 1, 16, torch.float32)
    before = q.clone(), k.clone()
    cos, sin = rotary_cos_sin_reference(torch.arange(4), 16, THETA, torch.float32)
    rotary.rotary_embedding_triton(q, k, cos, sin)
    assert torch.equal(q, before[0])
    assert torch.equal(k, before[1])
