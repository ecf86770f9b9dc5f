"""Build a ready-to-run model from a GGUF file or a Hugging Face safetensors folder."""

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from maas_services.common.model_cache import derived_folder, publish
from maas_services.engine.gguf_loader import load_gguf
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.quantization.config import QuantizationConfig
from maas_services.engine.quantization.quantize import quantize_model
from maas_services.engine.safetensors_loader import load_safetensors


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    progress: bool = True,
    quantization: QuantizationConfig | None = None,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    path = Path(path)
    config, weights = _load_gguf_cached(path) if path.is_file() else load_safetensors(path)
    quantizing = quantization is not None and quantization.enabled
    # Layers to be quantized load in float32 first, so their weights are rounded once.
    load_dtype = torch.float32 if quantizing else dtype
    # Parameters start on the meta device: random init of memory we overwrite is wasted time.
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(load_dtype)
    _materialize(model, device)
    params = dict(model.named_parameters())
    filled = dict.fromkeys(params, 0)
    for name in tqdm(weights, desc="Loading weights", unit="tensor", disable=not progress):
        module_path, kind = name.rsplit(".", 1)
        parent, _, module = module_path.rpartition(".")
        if module in model.packed_modules_mapping:
            fused, shard = model.packed_modules_mapping[module]
            target = f"{parent}.{fused}.{kind}"
            destination = model.get_submodule(f"{parent}.{fused}").shard(kind, shard)
        elif name in params:
            target, destination = name, params[name].data
        else:
            raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
        tensor = weights[name]
        if tensor.shape != destination.shape:
            raise ValueError(
                f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                f"model wants {tuple(destination.shape)}"
            )
        destination.copy_(tensor)
        filled[target] += tensor.numel()
    # Counting elements rather than names also catches a fused projection missing one part.
    missing = [name for name, param in params.items() if filled[name] != param.numel()]
    if missing:
        raise ValueError(f"checkpoint does not fill {missing}")
    model = model.eval().requires_grad_(False)
    if quantizing:
        model = quantize_model(model, quantization, dtype, source=path)
    return model, config


def derive_hf_folder(path: Path) -> Path:
    """The GGUF's weights and config.json in its model-cache folder, written if missing
    (what a peer that cannot read GGUF, vLLM, loads); the folder may lack them if
    the cache is unwritable."""
    _load_gguf_cached(path)
    return derived_folder(path)


def _materialize(model: torch.nn.Module, device: torch.device | str) -> None:
    """The meta model's parameters and buffers as uninitialised memory on device (the
    checkpoint fills them next). Not Module.to_empty: on meta tensors its empty_like
    runs torch's Python reference, whose first call imports sympy, ~1 s of CPU at
    every engine start (measured)."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            empty = torch.empty(param.shape, dtype=param.dtype, device=device)
            setattr(module, name, torch.nn.Parameter(empty, requires_grad=param.requires_grad))
        for name, buffer in list(module.named_buffers(recurse=False)):
            setattr(module, name, torch.empty(buffer.shape, dtype=buffer.dtype, device=device))


def _load_gguf_cached(path: Path) -> tuple[ModelConfig, Mapping[str, torch.Tensor]]:
    # The float32 Hugging Face folder this writes loads the same tensors (tested)
    # without parsing the GGUF's metadata or dequantizing it again.
    folder = derived_folder(path)
    if (folder / _CONFIG).is_file():
        return load_safetensors(folder)
    config, lazy = load_gguf(path)
    # config.json goes last: its presence says the folder's weights are whole.
    hf_config = json.dumps(config.to_hf_config(), indent=2)
    if _write_shards(lazy, folder) and publish(folder, _CONFIG, lambda p: p.write_text(hf_config)):
        return load_safetensors(folder)
    return config, lazy


_CONFIG = "config.json"
_INDEX = "model.safetensors.index.json"
# A shard is dequantized whole before it is written: this bounds the float32
# held at once (a 7B model is 28 GB of it), as the lazy GGUF mapping does.
_SHARD_BYTES = 1 << 30


def _write_shards(weights: Mapping[str, torch.Tensor], folder: Path) -> bool:
    """The weights in shards, then Hugging Face's index of which shard holds each
    tensor: transformers loads a sharded folder only through it."""
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    size = written = 0
    for name in weights:
        tensor = weights[name].contiguous()
        if shard and size + tensor.nbytes > _SHARD_BYTES:
            written += 1
            if not _publish_shard(folder, written, shard, weight_map):
                return False
            shard, size = {}, 0
        shard[name] = tensor
        size += tensor.nbytes
    if not _publish_shard(folder, written + 1, shard, weight_map):
        return False
    index = json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2)
    return publish(folder, _INDEX, lambda p: p.write_text(index))


def _publish_shard(
    folder: Path, index: int, tensors: dict[str, torch.Tensor], weight_map: dict[str, str]
) -> bool:
    """Shard number index, its tensors entered in weight_map."""
    file = f"model-{index:05d}.safetensors"
    weight_map.update(dict.fromkeys(tensors, file))
    return publish(folder, file, lambda p: save_file(tensors, p))
