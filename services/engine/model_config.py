"""The shape of a Llama-family model, read from GGUF metadata or a Hugging Face config."""

from dataclasses import dataclass
from typing import Any

from gguf import GGUFReader

# Qwen2 is Llama with biases on q/k/v; the rest of the family differs only in numbers.
_ATTENTION_BIAS = {"llama": False, "qwen2": True}


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_model_len: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    attention_bias: bool = False
    # Other ids that end a turn (Llama 3's <|eot_id|>); a list-valued eos in a HF config lands here.
    extra_eos_token_ids: tuple[int, ...] = ()

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        first = () if self.eos_token_id is None else (self.eos_token_id,)
        return first + self.extra_eos_token_ids

    @classmethod
    def from_gguf(cls, reader: GGUFReader) -> "ModelConfig":
        def get(key: str, default: Any = None) -> Any:
            field = reader.fields.get(key)
            return default if field is None else field.contents()

        arch = get("general.architecture")
        if arch not in _ATTENTION_BIAS:
            raise NotImplementedError(f"GGUF architecture {arch!r} is not supported")
        scaling = get(f"{arch}.rope.scaling.type", "none")
        if scaling != "none":
            raise NotImplementedError(f"rope scaling {scaling!r} is not supported")
        hidden = get(f"{arch}.embedding_length")
        heads = get(f"{arch}.attention.head_count")
        head_dim = get(f"{arch}.attention.key_length", hidden // heads)
        if get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
            raise NotImplementedError("partial rotary embeddings are not supported")
        names = {t.name for t in reader.tensors}
        vocab = get(f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
        extra = (get("tokenizer.ggml.eot_token_id"), get("tokenizer.ggml.eom_token_id"))
        eos = get("tokenizer.ggml.eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=get(f"{arch}.feed_forward_length"),
            num_layers=get(f"{arch}.block_count"),
            num_heads=heads,
            num_kv_heads=get(f"{arch}.attention.head_count_kv", heads),
            head_dim=head_dim,
            rms_norm_eps=get(f"{arch}.attention.layer_norm_rms_epsilon"),
            rope_theta=get(f"{arch}.rope.freq_base", 10000.0),
            max_model_len=get(f"{arch}.context_length"),
            tie_word_embeddings="output.weight" not in names,
            bos_token_id=get("tokenizer.ggml.bos_token_id"),
            eos_token_id=eos,
            attention_bias=_ATTENTION_BIAS[arch],
            extra_eos_token_ids=tuple(i for i in extra if i is not None and i != eos),
        )

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "ModelConfig":
        arch = cfg["model_type"]
        if arch not in _ATTENTION_BIAS:
            raise NotImplementedError(f"model_type {arch!r} is not supported")
        # transformers 5 folds rope_theta and rope_scaling into rope_parameters.
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(f"rope scaling {rope_type!r} is not supported")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg["rms_norm_eps"],
            rope_theta=cfg.get("rope_theta") or rope.get("rope_theta", 10000.0),
            max_model_len=cfg["max_position_embeddings"],
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos_ids[0] if eos_ids else None,
            attention_bias=cfg.get("attention_bias", _ATTENTION_BIAS[arch]),
            extra_eos_token_ids=tuple(eos_ids[1:]),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """A Hugging Face config.json for this shape; from_hf_config reads it back."""
        eos = list(self.eos_token_ids)
        return {
            "model_type": self.architecture,
            "architectures": [
                "Qwen2ForCausalLM" if self.architecture == "qwen2" else "LlamaForCausalLM"
            ],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_model_len,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }
