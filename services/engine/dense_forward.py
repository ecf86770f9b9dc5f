"""The model's weights run the textbook way: whole sequences, plain causal SDPA.

No KV cache and no paging, so autograd can run through it: `maas
distill-draft` trains a draft model with it, and tests use it as the
reference the paged forward must match. It calls the plain-torch twins of the
kernels (kernels/*_ref.py) directly, never maas_kernels.ops: on a GPU too it stays
the reference, and stays differentiable.
"""

import torch
import torch.nn.functional as F

from maas_kernels.activation_ref import silu_and_mul_reference
from maas_kernels.rms_norm_ref import rms_norm_residual_reference
from maas_kernels.rotary_ref import rotary_cos_sin_reference, rotary_embedding_reference
from maas_services.engine.model import LlamaForCausalLM, RMSNorm


def _norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return rms_norm_residual_reference(x, None, norm.weight, norm.eps)[0]


def dense_hidden(model: LlamaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states of a batch of equal-length sequences, [batch, seq, hidden]."""
    config = model.config
    h = model.model.embed_tokens(input_ids)
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
    cos, sin = rotary_cos_sin_reference(positions, config.head_dim, config.rope_theta, h.dtype)
    heads = (config.num_heads, config.head_dim)
    kv_heads = (config.num_kv_heads, config.head_dim)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        q, k, v = attn.qkv_proj(_norm(layer.input_layernorm, h)).split(
            attn.qkv_proj.shard_sizes, -1
        )
        q, k = rotary_embedding_reference(
            q.unflatten(-1, heads), k.unflatten(-1, kv_heads), cos, sin
        )
        # [batch, seq, heads, dim] -> [batch, heads, seq, dim] for SDPA.
        q, k, v = (
            q.transpose(-3, -2),
            k.transpose(-3, -2),
            v.unflatten(-1, kv_heads).transpose(-3, -2),
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + attn.o_proj(out.transpose(-3, -2).flatten(-2))
        gate_up = mlp.gate_up_proj(_norm(layer.post_attention_layernorm, h))
        h = h + mlp.down_proj(silu_and_mul_reference(gate_up))
    return _norm(model.model.norm, h)


@torch.inference_mode()
def dense_logits(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    """float32 logits at every position of one sequence, [len(token_ids), vocab]."""
    hidden = dense_hidden(model, torch.tensor([token_ids]))[0]
    return model.compute_logits(hidden).float()
