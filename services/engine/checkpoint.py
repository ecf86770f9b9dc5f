"""Write a model as a Hugging Face folder (config.json + model.safetensors).

The inverse of the safetensors loader: fused projections are split back into
the checkpoint's q/k/v and gate/up tensors, so the folder loads here and in
transformers alike. `maas distill-draft` saves its draft models this way.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from maas_services.engine.model import LlamaForCausalLM


def checkpoint_tensors(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's parameters under checkpoint names, unfused, contiguous, on the CPU."""
    unfused = {fused: [] for fused, _ in model.packed_modules_mapping.values()}
    for name, (fused, shard) in model.packed_modules_mapping.items():
        unfused[fused].append((shard, name))
    tensors = {}
    for name, param in model.named_parameters():
        module_path, kind = name.rsplit(".", 1)
        parent, _, module = module_path.rpartition(".")
        if module in unfused:
            fused = model.get_submodule(module_path)
            for shard, original in unfused[module]:
                tensors[f"{parent}.{original}.{kind}"] = fused.shard(kind, shard)
        else:
            tensors[name] = param.data
    return {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}


def save_model(model: LlamaForCausalLM, folder: str | Path, metadata: dict | None = None) -> Path:
    """Write the folder; metadata becomes extra keys of config.json (e.g. what it drafts for)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config.to_hf_config() | (metadata or {})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(checkpoint_tensors(model), folder / "model.safetensors")
    return folder
