"""Weights from a llama.cpp GGUF file, renamed to our (Hugging Face) module names."""

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from maas_services.engine.model_config import ModelConfig

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# llama.cpp's converter reorders q/k rows for these architectures only.
_PERMUTED_ARCHITECTURES = {"llama"}


def load_gguf(path: str | Path) -> tuple[ModelConfig, Mapping[str, torch.Tensor]]:
    reader = GGUFReader(path)
    config = ModelConfig.from_gguf(reader)
    return config, GGUFTensors(reader, config)


class GGUFTensors(Mapping[str, torch.Tensor]):
    """float32 weights by our name, dequantized on each access.

    Lazy so that a loader can cast each tensor to its target dtype before the
    next one exists, instead of holding the whole model in float32.
    """

    def __init__(self, reader: GGUFReader, config: ModelConfig):
        self._config = config
        self._tensors = {_our_name(t.name): t for t in reader.tensors}

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dimensions fastest first
        weight = torch.tensor(dequantize(t.data, t.tensor_type)).reshape(shape)
        if self._config.architecture in _PERMUTED_ARCHITECTURES:
            if name.endswith("q_proj.weight"):
                return _unpermute_rotary_rows(weight, self._config.num_heads)
            if name.endswith("k_proj.weight"):
                return _unpermute_rotary_rows(weight, self._config.num_kv_heads)
        return weight

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def _our_name(gguf_name: str) -> str:
    module, kind = gguf_name.rsplit(".", 1)
    try:
        if module.startswith("blk."):
            _, layer, part = module.split(".", 2)
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
        return f"{_GLOBAL_NAMES[module]}.{kind}"
    except KeyError:
        raise ValueError(f"unsupported GGUF tensor {gguf_name!r}") from None


def _unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    # The converter turned each head's rows [first half, second half] into
    # interleaved pairs (for llama.cpp's rope kernel); our rotary wants the halves back.
    rows = weight.shape[0]
    pairs = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return pairs.transpose(1, 2).reshape(weight.shape)
