"""A GGUF checkpoint's own quantized blocks, parsed once and cached beside the model.

Two kinds of engine read them: a float32 engine for its narrow steps
(checkpoint_blocks.py) and an int4 (group 32) or int8-head engine, whose layers
then hold exactly the file's weights (quantize.py). Reading them from the GGUF
parses its metadata (~5 s for SmolLM2's 49k-token vocabulary), which every engine
start would pay; so the first reader keeps them as one safetensors file under the
model's derived folder (common/model_cache.py), in a subfolder: the folder's own
*.safetensors are the model's weights, which the loader and vLLM read whole. The
file is the GGUF's layout whatever the engine's settings (its head as the file ties
it), so it serves every later engine of that file, and loads in a fraction of a
second. A pod whose cache is read-only pays the parse each start, as it does for
the model itself.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from gguf import GGUFReader
from safetensors.torch import load_file, save_file

from maas_services.common.model_cache import derived_folder, publish
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.quantization import gguf_blocks
from maas_services.engine.quantization.config import QUANTIZED_MODULES
from maas_services.engine.quantization.gguf_blocks import GROUP_SIZE
from maas_services.engine.quantization.int4 import Int4Weight
from maas_services.engine.quantization.int8 import Int8Weight

# Keys: a fused module's name + ".packed" / ".scales" / ".mins", and "head.q" / "head.scale".
_CACHE_FOLDER = "checkpoint-blocks"
_CACHE_FILE = "blocks.safetensors"
_HEAD = "head"
_INT4_PARTS = ("packed", "scales", "mins")


@dataclass(frozen=True)
class FileBlocks:
    # The QUANTIZED_MODULES (by fused module name) whose every part is Q4_0/Q4_1.
    projections: dict[str, Int4Weight]
    # The LM head (the token embedding where the file ties them) where it is Q8_0.
    head: Int8Weight | None


def file_blocks(model: LlamaForCausalLM, source: str | Path | None) -> FileBlocks:
    """The blocks of the GGUF file at source (none for a folder or no source), each kept
    only where every array has the shape the kernels will read for its module of model
    (a cached file is read back as it lies: a stale or damaged one must not make a
    kernel read past an array)."""
    if source is None or not Path(source).is_file():
        return FileBlocks({}, None)
    tensors = _cached(model, Path(source))
    projections = {}
    for name in {key.rpartition(".")[0] for key in tensors} - {_HEAD}:
        weight = Int4Weight(*(tensors[f"{name}.{part}"] for part in _INT4_PARTS), GROUP_SIZE)
        module = model.get_submodule(name)
        if _fits(weight, module.weight.shape):
            projections[name] = weight
    head = None
    if f"{_HEAD}.q" in tensors:
        head = Int8Weight(tensors[f"{_HEAD}.q"], tensors[f"{_HEAD}.scale"], GROUP_SIZE)
        # The head's shape is the embedding's, tied or not.
        if not _fits(head, model.model.embed_tokens.weight.shape):
            head = None
    return FileBlocks(projections, head)


def _fits(block: Int4Weight | Int8Weight, shape: torch.Size) -> bool:
    n, k = shape
    groups = (n, k // GROUP_SIZE)
    if isinstance(block, Int8Weight):
        return block.q.shape == shape and block.scale.shape == groups
    return block.packed.shape == (n, k // 2) and block.scales.shape == block.mins.shape == groups


def _cached(model: LlamaForCausalLM, source: Path) -> dict[str, torch.Tensor]:
    folder = derived_folder(source) / _CACHE_FOLDER
    if (folder / _CACHE_FILE).is_file():
        return load_file(folder / _CACHE_FILE)
    reader = GGUFReader(source)
    tensors: dict[str, torch.Tensor] = {}
    projections = gguf_blocks.read_int4_blocks(
        reader, model.config, model.packed_modules_mapping, QUANTIZED_MODULES
    )
    for name, weight in projections.items():
        for part in _INT4_PARTS:
            tensors[f"{name}.{part}"] = getattr(weight, part).contiguous()
    head = gguf_blocks.read_int8_head(reader, tied=model.config.tie_word_embeddings)
    if head is not None:
        tensors[f"{_HEAD}.q"], tensors[f"{_HEAD}.scale"] = head.q, head.scale.contiguous()
    publish(folder, _CACHE_FILE, lambda path: save_file(tensors, path))
    return tensors
