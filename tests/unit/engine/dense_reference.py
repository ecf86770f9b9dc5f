"""The model's weights run the textbook way: one sequence, whole, plain causal SDPA."""

import torch
import torch.nn.functional as F

from services.engine.model import LlamaForCausalLM, apply_rotary, rotary_cos_sin


@torch.inference_mode()
def dense_logits(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    """float32 logits at every position of token_ids, [len(token_ids), vocab]."""
    config = model.config
    h = model.model.embed_tokens(torch.tensor(token_ids))
    positions = torch.arange(len(token_ids))
    cos, sin = rotary_cos_sin(positions, config.head_dim, config.rope_theta, h.dtype)
    for layer in model.model.layers:
        attn = layer.self_attn
        q, k, v = attn.qkv_proj(layer.input_layernorm(h)).split(attn.qkv_proj.shard_sizes, -1)
        q = apply_rotary(q.unflatten(-1, (config.num_heads, config.head_dim)), cos, sin)
        k = apply_rotary(k.unflatten(-1, (config.num_kv_heads, config.head_dim)), cos, sin)
        v = v.unflatten(-1, (config.num_kv_heads, config.head_dim))
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )
        h = h + attn.o_proj(out.transpose(0, 1).flatten(1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.compute_logits(model.model.norm(h)).float()
