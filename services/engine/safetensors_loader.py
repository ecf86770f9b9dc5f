"""Weights from a Hugging Face model folder (config.json + *.safetensors)."""

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open

from maas_services.engine.model_config import ModelConfig


def load_safetensors(folder: str | Path) -> tuple[ModelConfig, Mapping[str, torch.Tensor]]:
    folder = Path(folder)
    config = ModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return config, SafetensorsTensors(files, config)


class SafetensorsTensors(Mapping[str, torch.Tensor]):
    """float32 weights by name, read from the memory-mapped shard on each access."""

    def __init__(self, files: list[Path], config: ModelConfig):
        self._files: dict[str, Path] = {}
        for file in files:
            with safe_open(file, framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if not _derived(name, config):
                        self._files[name] = file

    def __getitem__(self, name: str) -> torch.Tensor:
        with safe_open(self._files[name], framework="pt") as shard:
            return shard.get_tensor(name).float()

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def _derived(name: str, config: ModelConfig) -> bool:
    # Some exports save copies of what we compute or share: rotary frequencies and a tied head.
    return name.endswith("rotary_emb.inv_freq") or (
        config.tie_word_embeddings and name == "lm_head.weight"
    )
