"""A PEFT LoRA folder read into the engine's layout, or AdapterInvalid saying why not.

PEFT saves `adapter_config.json` (r, lora_alpha, target_modules, use_rslora, ...) and
`adapter_model.safetensors`, whose keys name the checkpoint's projections:
`base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`. Our model fuses
q/k/v into qkv_proj and gate/up into gate_up_proj (model.py), so each fused module
gets one low-rank pair: A stacks its shards' A matrices and B is block-diagonal, zero
where a shard is not targeted. Every layer gets every module the adapter targets in
any layer (zeros where a layer is not), each module rank x shards wide: the same
layout in every layer, which lets a step put its adapters side by side once for all
layers (step_lora.py). The zeros add exactly. Both are kept transposed, ready for
`x @ a_t @ b_t`, and the scaling (lora_alpha / r, or / sqrt(r) with rsLoRA) is folded
into B once, here.

Everything is checked before anything is kept: the rank against --max-lora-rank, each
target against the model's projections, each tensor's shape against the model's
dimensions, the files' presence and integrity, and PEFT features we do not compute
(DoRA, trained biases, extra trained modules, per-module rank or alpha patterns).
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from maas_services.engine.lora.errors import AdapterInvalid
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# Checkpoint projection -> (our module, shard index): the model's own packing (the loader's)
# plus the two projections it keeps whole.
PROJECTIONS = {
    **LlamaForCausalLM.packed_modules_mapping,
    "o_proj": ("o_proj", 0),
    "down_proj": ("down_proj", 0),
}
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)
# Config fields whose other values change the computation in ways we do not run:
# field -> the values that do not (the first is PEFT's default for an absent field).
_UNSUPPORTED = {
    "use_dora": (False, None),
    "bias": ("none", None),
    "lora_bias": (False, None),
    "modules_to_save": (None, []),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "fan_in_fan_out": (False, None),
    "layer_replication": (None,),
    "trainable_token_indices": (None,),
    "alora_invocation_tokens": (None,),
    "use_qalora": (False, None),
    "use_bdlora": (None, False),
    "target_parameters": (None, []),
    "arrow_config": (None,),
}


@dataclass
class LowRank:
    """One module's update: its output gains x @ a_t @ b_t."""

    a_t: torch.Tensor  # [in_features, rank x shards]: A^T
    b_t: torch.Tensor  # [rank x shards, out_features]: B^T, the scaling folded in


@dataclass
class AdapterWeights:
    """An adapter in the model's layout: per layer, module name -> its LowRank."""

    rank: int
    layers: list[dict[str, LowRank]]

    def to(self, device: torch.device | str, dtype: torch.dtype) -> "AdapterWeights":
        return AdapterWeights(
            self.rank,
            [
                {
                    name: LowRank(m.a_t.to(device, dtype), m.b_t.to(device, dtype))
                    for name, m in layer.items()
                }
                for layer in self.layers
            ],
        )


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, list[int]]]:
    """Our module name -> (in_features, out_features of each shard)."""
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    hidden, mlp = config.hidden_size, config.intermediate_size
    return {
        "qkv_proj": (hidden, [q, kv, kv]),
        "o_proj": (q, [hidden]),
        "gate_up_proj": (hidden, [mlp, mlp]),
        "down_proj": (mlp, [hidden]),
    }


def load_adapter_weights(source: str, config: ModelConfig, max_rank: int) -> AdapterWeights:
    """The PEFT folder at `source` as float32 AdapterWeights, or AdapterInvalid."""
    folder = Path(source)
    peft = _read_config(folder / CONFIG_FILE)
    rank, scaling = _rank_and_scaling(peft, max_rank)
    _check_targets(peft.get("target_modules"))
    tensors = _read_tensors(folder / WEIGHTS_FILE)
    pairs = _pairs(tensors, config.num_layers)
    shapes = module_shapes(config)
    layers: list[dict[str, LowRank]] = [{} for _ in range(config.num_layers)]
    grouped: dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    for (layer, projection), (a, b) in pairs.items():
        module, shard = PROJECTIONS[projection]
        in_features, outs = shapes[module]
        where = f"layer {layer} {projection}"
        if a.shape != (rank, in_features):
            raise AdapterInvalid(
                f"{where}: lora_A is {tuple(a.shape)}, the model needs ({rank}, {in_features})"
            )
        if b.shape != (outs[shard], rank):
            raise AdapterInvalid(
                f"{where}: lora_B is {tuple(b.shape)}, the model needs ({outs[shard]}, {rank})"
            )
        grouped.setdefault((layer, module), {})[shard] = (a, b)
    for module in {module for _, module in grouped}:
        for layer in range(config.num_layers):
            shards = grouped.get((layer, module), {})
            layers[layer][module] = _fuse(shards, shapes[module], rank, scaling)
    return AdapterWeights(rank, layers)


def _read_config(path: Path) -> dict:
    try:
        peft = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise AdapterInvalid(f"{path} is missing: not a PEFT adapter folder") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterInvalid(f"{path} is unreadable: {exc}") from exc
    if not isinstance(peft, dict):
        raise AdapterInvalid(f"{path} is not a JSON object")
    if peft.get("peft_type", "LORA") != "LORA":
        raise AdapterInvalid(f"peft_type {peft['peft_type']!r}: only LORA adapters are served")
    for field, defaults in _UNSUPPORTED.items():
        if peft.get(field, defaults[0]) not in defaults:
            raise AdapterInvalid(f"{field}={peft[field]!r} is not supported (plain LoRA only)")
    return peft


def _rank_and_scaling(peft: dict, max_rank: int) -> tuple[int, float]:
    rank, alpha = peft.get("r"), peft.get("lora_alpha")
    if not isinstance(rank, int) or rank <= 0:
        raise AdapterInvalid(f"r={rank!r}: the rank must be a positive integer")
    if rank > max_rank:
        raise AdapterInvalid(f"rank {rank} is above this engine's --max-lora-rank {max_rank}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise AdapterInvalid(f"lora_alpha={alpha!r}: must be a number")
    # PEFT's LoraLayer.update_layer: rsLoRA divides by the root of the rank.
    return rank, alpha / (math.sqrt(rank) if peft.get("use_rslora") else rank)


def _check_targets(targets) -> None:
    """A list of names must name the model's projections; a regex (a string) is checked
    through the keys it produced (_pairs)."""
    if isinstance(targets, str):
        return
    if not isinstance(targets, list) or not targets:
        raise AdapterInvalid(f"target_modules={targets!r}: expected a non-empty list")
    lacking = sorted(set(targets) - set(PROJECTIONS))
    if lacking:
        raise AdapterInvalid(
            f"target modules {lacking} are not in this model (it has {sorted(PROJECTIONS)})"
        )


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        bin_file = path.with_name("adapter_model.bin")
        hint = " (only safetensors are read, not adapter_model.bin)" if bin_file.exists() else ""
        raise AdapterInvalid(f"{path} is missing{hint}")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise AdapterInvalid(f"{path} is corrupt: {exc}") from exc


def _pairs(
    tensors: dict[str, torch.Tensor], num_layers: int
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, projection) -> (A, B) as float32, every key accounted for."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterInvalid(f"tensor {key!r} is not a LoRA weight of a decoder projection")
        layer, projection, half = int(match[1]), match[2], match[3]
        if projection not in PROJECTIONS:
            raise AdapterInvalid(f"tensor {key!r}: this model has no {projection!r}")
        if layer >= num_layers:
            raise AdapterInvalid(f"tensor {key!r}: this model has {num_layers} layers")
        if not tensor.is_floating_point() or not torch.isfinite(tensor).all():
            raise AdapterInvalid(f"tensor {key!r} holds non-finite or non-float values")
        halves.setdefault((layer, projection), {})[half] = tensor.float()
    if not halves:
        raise AdapterInvalid("the adapter holds no LoRA weights")
    for (layer, projection), pair in halves.items():
        if len(pair) != 2:
            raise AdapterInvalid(f"layer {layer} {projection}: lora_A or lora_B is missing")
    return {where: (pair["A"], pair["B"]) for where, pair in halves.items()}


def _fuse(
    shards: dict[int, tuple[torch.Tensor, torch.Tensor]],
    shape: tuple[int, list[int]],
    rank: int,
    scale: float,
) -> LowRank:
    """One module's shards as one pair, zero where a shard is absent (module docstring)."""
    in_features, outs = shape
    a_t = torch.zeros(in_features, rank * len(outs))
    b_t = torch.zeros(rank * len(outs), sum(outs))
    for shard, (a, b) in shards.items():
        columns = slice(shard * rank, (shard + 1) * rank)
        row = sum(outs[:shard])
        a_t[:, columns] = a.T
        b_t[columns, row : row + outs[shard]] = b.T * scale
    return LowRank(a_t, b_t)
