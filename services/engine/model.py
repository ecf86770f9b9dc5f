"""Llama-family decoder (Llama, SmolLM, Qwen2) over the paged KV pool.

A forward pass takes the new tokens of several sequences back to back, so one
call can prefill prompts in chunks, decode a batch, or mix both; the linear
layers see one flat batch of tokens with no padding.

Two paths compute the same function. The torch path (`forward` of every
module) is what the CPU serves and what tests hold to transformers token for
token. The kernel path (`forward_kernels`) runs kernels/ (docs/kernels.md):
on CUDA the Triton kernels, a fused residual add + RMSNorm, SiLU-and-mul,
rotary and paged decode attention; LlamaForCausalLM.use_kernels picks the
path once a step. Quantized linear layers call kernels.int8_matmul and
kernels.int4_matmul on either path: those pick Triton by device themselves.
"""

import torch
import torch.nn.functional as F
from torch import nn

from kernels import rms_norm_residual, rotary_embedding, silu_and_mul
from services.engine.attention import paged_attention
from services.engine.attention_metadata import AttentionMetadata
from services.engine.kv_cache import PagedKVCache
from services.engine.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and scale after casting back, as the reference
        # implementation does, so low-precision runs round the same way.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class FusedLinear(nn.Linear):
    """Projections of one input done as one matmul; checkpoints store them apart."""

    def __init__(self, in_features: int, shard_sizes: list[int], bias: bool):
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = shard_sizes

    def shard(self, kind: str, index: int) -> torch.Tensor:
        """The rows of `weight` or `bias` that belong to projection `index`."""
        offset = sum(self.shard_sizes[:index])
        return getattr(self, kind).data.narrow(0, offset, self.shard_sizes[index])


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    # Angles in float32 whatever the model dtype: bfloat16 positions lose whole steps past 256.
    exponents = torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim
    angles = positions.float()[:, None] * (1.0 / theta**exponents)
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]  # [tokens, 1 (heads), head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Half-split pairing (dimension i rotates with i + head_dim/2), the Hugging Face layout.
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_size = config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = FusedLinear(
            config.hidden_size, [q_size, kv_size, kv_size], bias=config.attention_bias
        )
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of the new tokens, q and k rotated: [tokens, heads, head_dim] each."""
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.shard_sizes, dim=-1)
        q = apply_rotary(q.view(tokens, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary(k.view(tokens, self.num_kv_heads, self.head_dim), cos, sin)
        return q, k, v.view(tokens, self.num_kv_heads, self.head_dim)

    def forward_kernels(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """forward with q and k rotated in one kernel and decodes attended by the paged kernel."""
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.shard_sizes, dim=-1)
        # Strided views of the fused projection: the kernel reads them in place.
        q, k = rotary_embedding(
            q.view(tokens, self.num_heads, self.head_dim),
            k.view(tokens, self.num_kv_heads, self.head_dim),
            cos,
            sin,
        )
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        out = paged_attention(
            q, k, v, kv_cache.k[self.layer], kv_cache.v[self.layer], meta, use_kernel=True
        )
        return self.o_proj(out.view(tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = FusedLinear(config.hidden_size, [size, size], bias=False)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def forward_kernels(self, x: torch.Tensor) -> torch.Tensor:
        # One pass over the gate/up output instead of silu, then the product.
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # Paged attention (data-dependent layout, writes to the pool) sits between
        # two dense halves with fixed shapes: those are what compiled_forward.py compiles.
        q, k, v = self.attention_inputs(x, cos, sin)
        layer = self.self_attn.layer
        out = paged_attention(q, k, v, kv_cache.k[layer], kv_cache.v[layer], meta)
        return self.attention_outputs(x, out)

    def attention_inputs(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def attention_outputs(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual stream after attention's output projection and the MLP."""
        x = x + self.self_attn.o_proj(attended.flatten(1))
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_kernels(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward with each residual add fused into the RMSNorm that follows it.

        The residual stream travels beside the hidden states instead of through
        them: x is the previous sublayer's output not yet added (the embeddings,
        with residual None, in the first layer), and the layer returns its MLP's
        output and the stream before it. The sums are the torch path's
        `x + sublayer(x)`, rounded to the model dtype the same way; the last add
        happens in the final norm.
        """
        x, residual = rms_norm_residual(
            x, residual, self.input_layernorm.weight, self.input_layernorm.eps
        )
        x = self.self_attn.forward_kernels(x, cos, sin, kv_cache, meta)
        x, residual = rms_norm_residual(
            x, residual, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps
        )
        return self.mlp.forward_kernels(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        # Given a weight, Embedding skips its random init, whose normal_ on the meta
        # device imports torch's compiler: 3.5 s of every engine start.
        empty = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=empty)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    # Checkpoint projection name -> (our fused module, its shard), for the loader.
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # None: the kernel path for CUDA inputs, the torch path for anything else,
        # decided once a step. Tests set True (and kernels.ops.force_triton) to run
        # the CUDA path's Triton kernels in Triton's CPU interpreter; False keeps
        # the torch path on a GPU, to compare or to rule the kernels out.
        self.use_kernels: bool | None = None
        # Module names follow Hugging Face checkpoints so safetensors load by name.
        self.model = LlamaModel(config)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Run a step's new tokens, writing their keys and values into the pool.

        input_ids and positions are [tokens], the sequences back to back as meta
        lays them out. Returns the final hidden states, [tokens, hidden_size].
        """
        h = self.model.embed_tokens(input_ids)
        cos, sin = rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, h.dtype)
        use_kernels = input_ids.is_cuda if self.use_kernels is None else self.use_kernels
        if use_kernels:
            return self._forward_kernels(h, cos, sin, kv_cache, meta)
        for layer in self.model.layers:
            h = layer(h, cos, sin, kv_cache, meta)
        return self.model.norm(h)

    def _forward_kernels(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        residual = None
        for layer in self.model.layers:
            h, residual = layer.forward_kernels(h, residual, cos, sin, kv_cache, meta)
        h, _ = rms_norm_residual(h, residual, self.model.norm.weight, self.model.norm.eps)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(hidden, head.weight)
