"""Llama-family decoder (Llama, SmolLM, Qwen2) over the paged KV pool.

A forward pass takes the new tokens of several sequences back to back, so one
call can prefill prompts in chunks, decode a batch, or mix both; the linear
layers see one flat batch of tokens with no padding.

The modules call kernels/ (maas_kernels.ops), which runs the Triton
kernel on a CUDA tensor and its plain-torch twin anywhere else, so tests hold
the twins to transformers token for token (dense_forward.py is the reference
the paged forward must match). How each layer's two dense halves run (these
methods eagerly, compiled, or native C++ on a float32 CPU) is the ComputePath
the forward is given (compute_path.py): ModelRunner chooses it once at load. The
residual stream travels beside the hidden states so that each residual add is
fused into the RMSNorm after it (DecoderLayer.forward). Quantized linear layers
call maas_kernels.int8_matmul and maas_kernels.int4_matmul, which pick by device too.
"""

import torch
from torch import nn

from maas_kernels.ops import rms_norm_residual, rotary_embedding, silu_and_mul, uses_triton
from maas_kernels.rotary_ref import rotary_cos_sin_reference
from maas_services.engine import cpu_linear
from maas_services.engine.attention import paged_attention
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.compute_path import EAGER, ComputePath
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.lora.step_lora import LayerLora, StepLora
from maas_services.engine.model_config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); with residual None, (norm(x), x)."""
        return rms_norm_residual(x, residual, self.weight, self.eps)


class FusedLinear(nn.Linear):
    """Projections of one input done as one matmul; checkpoints store them apart."""

    def __init__(self, in_features: int, shard_sizes: list[int], bias: bool):
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = shard_sizes

    def shard(self, kind: str, index: int) -> torch.Tensor:
        """The rows of `weight` or `bias` that belong to projection `index`."""
        offset = sum(self.shard_sizes[:index])
        return getattr(self, kind).data.narrow(0, offset, self.shard_sizes[index])


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
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of the new tokens, q and k rotated: [tokens, heads, head_dim] each."""
        tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        if lora is not None:
            lora.add("qkv_proj", x, qkv)
        q, k, v = qkv.split(self.qkv_proj.shard_sizes, dim=-1)
        # Strided views of the fused projection: the rotary kernel reads them in place.
        q, k = rotary_embedding(
            q.view(tokens, self.num_heads, self.head_dim),
            k.view(tokens, self.num_kv_heads, self.head_dim),
            cos,
            sin,
        )
        return q, k, v.view(tokens, self.num_kv_heads, self.head_dim)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = FusedLinear(config.hidden_size, [size, size], bias=False)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, lora: LayerLora | None = None) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if lora is not None:
            lora.add("gate_up_proj", x, gate_up)
        # One pass over the gate/up output instead of silu, then the product.
        activated = silu_and_mul(gate_up)
        out = self.down_proj(activated)
        if lora is not None:
            lora.add("down_proj", activated, out)
        return out


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
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
        path: ComputePath = EAGER,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer with each residual add fused into the RMSNorm that follows it.

        x is the previous sublayer's output not yet added to the stream (the
        embeddings, with residual None, in the first layer); the layer returns
        its MLP's output and the stream before it. The sums are the textbook
        `x + sublayer(x)`, rounded to the model dtype the same way; the last
        add happens in the final norm. Paged attention (data-dependent layout,
        writes to the pool) sits between two dense halves with fixed shapes:
        those run through `path` (eager, compiled or native), with the step's
        adapters where some rows run one (`lora`, lora/step_lora.py).
        """
        q, k, v, residual = path.attention_inputs(self, x, residual, cos, sin, lora)
        layer = self.self_attn.layer
        out = paged_attention(
            q, k, v, kv_cache.k[layer], kv_cache.v[layer], meta, use_kernel=uses_triton(q)
        )
        return path.attention_outputs(self, out, residual, lora)

    def attention_inputs(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of the normed stream, and the stream."""
        x, residual = self.input_layernorm(x, residual)
        return *self.self_attn.project(x, cos, sin, lora), residual

    def attention_outputs(
        self, attended: torch.Tensor, residual: torch.Tensor, lora: LayerLora | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLP's output after attention's output projection, and the stream before it."""
        attended = attended.flatten(1)
        x = self.self_attn.o_proj(attended)
        if lora is not None:
            lora.add("o_proj", attended, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x, lora), residual


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
        # Module names follow Hugging Face checkpoints so safetensors load by name.
        self.model = LlamaModel(config)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: its embedding's (a KV pool may be narrower,
        --kv-cache-dtype; quantized projections keep their own)."""
        return self.model.embed_tokens.weight.dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: PagedKVCache,
        meta: AttentionMetadata,
        path: ComputePath = EAGER,
        lora: StepLora | None = None,
    ) -> torch.Tensor:
        """Run a step's new tokens, writing their keys and values into the pool.

        input_ids and positions are [tokens], the sequences back to back as meta
        lays them out. Returns the final hidden states, [tokens, hidden_size].
        `path` runs the layers' dense halves, or the whole decode step where it can.
        `lora`, when some rows run an adapter, adds its low-rank products beside
        the projections, on whichever path runs them.
        """
        h = self.model.embed_tokens(input_ids)
        config = self.config
        cos, sin = rotary_cos_sin_reference(positions, config.head_dim, config.rope_theta, h.dtype)
        decoded = path.decode_step(self, h, cos, sin, kv_cache, meta, lora)
        if decoded is not None:
            h, residual = decoded
        else:
            residual = None
            for i, layer in enumerate(self.model.layers):
                layer_lora = None if lora is None else lora.layer(i)
                h, residual = layer(h, residual, cos, sin, kv_cache, meta, path, layer_lora)
        return self.model.norm(h, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            # The widest matmul: the native GEMM or row slices on the CPU (cpu_linear.py).
            return cpu_linear.linear(hidden, self.model.embed_tokens.weight)
        # A module: a quantized engine's head is one even when tied (quantize.py).
        return self.lm_head(hidden)
