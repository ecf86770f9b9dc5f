"""The model's weights run the textbook way: whole sequences, plain causal SDPA.

No KV cache and no paging, so autograd can run through it: `maas
distill-draft` trains a draft model with it, and tests use it as the
reference the paged forward must match.
"""

import torch
import torch.nn.functional as F

from services.engine.model import LlamaForCausalLM, apply_rotary, rotary_cos_sin


def dense_hidden(model: LlamaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    """Final hidden states of a batch of equal-length sequences, [batch, seq, hidden]."""
    config = model.config
    h = model.model.embed_tokens(input_ids)
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
    cos, sin = rotary_cos_sin(positions, config.head_dim, config.rope_theta, h.dtype)
    heads = (config.num_heads, config.head_dim)
    kv_heads = (config.num_kv_heads, config.head_dim)
    for layer in model.model.layers:
        attn = layer.self_attn
        q, k, v = attn.qkv_proj(layer.input_layernorm(h)).split(attn.qkv_proj.shard_sizes, -1)
        # [batch, seq, heads, dim] -> [batch, heads, seq, dim] for SDPA.
        q = apply_rotary(q.unflatten(-1, heads), cos, sin).transpose(-3, -2)
        k = apply_rotary(k.unflatten(-1, kv_heads), cos, sin).transpose(-3, -2)
        v = v.unflatten(-1, kv_heads).transpose(-3, -2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + attn.o_proj(out.transpose(-3, -2).flatten(-2))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.model.norm(h)


@torch.inference_mode()
def dense_logits(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    """float32 logits at every position of one sequence, [len(token_ids), vocab]."""
    hidden = dense_hidden(model, torch.tensor([token_ids]))[0]
    return model.compute_logits(hidden).float()
