"""What the core refuses of an adapter load before it reads anything: names a
model name could not be, and weights files larger than any adapter.

A name is what a request sends as its model, and vllm:lora_requests_info lists
the names of running adapters joined by commas (as vLLM does, for llm-d's LoRA
affinity): so at most a model name's length (MAX_MODEL_CHARS), and no comma,
whitespace or control character.

The weights: the largest adapter file the core reads between two steps.

The core loads an adapter between steps (engine_core.py), so a load delays the
step after it by the time to read and check its weights. A LoRA of this model
at --max-lora-rank on every projection, even in float64, has a known size; a
weights file larger than that is no adapter this engine could serve (most often
a whole model's folder given by mistake), and reading it first would stall every
running request for seconds and hold its size in memory. It is refused
(AdapterInvalid) on its size, before a byte of it is read.
"""

import os
from pathlib import Path

from maas_services.common.openai_api.schemas import MAX_MODEL_CHARS
from maas_services.engine.lora.adapter import WEIGHTS_FILE, module_shapes
from maas_services.engine.lora.errors import AdapterInvalid
from maas_services.engine.model_config import ModelConfig

# float64, the widest float a PEFT file may hold.
MAX_BYTES_PER_WEIGHT = 8
# The safetensors header: a JSON line per tensor, a few hundred tensors.
HEADER_BYTES = 1 << 20


def max_adapter_bytes(config: ModelConfig, max_rank: int) -> int:
    """The weights file of an adapter of rank max_rank on every projection of the model."""
    # Each projection's A is [rank, in] and its B [out, rank].
    per_layer = sum(
        max_rank * (in_features + out)
        for in_features, outs in module_shapes(config).values()
        for out in outs
    )
    return per_layer * config.num_layers * MAX_BYTES_PER_WEIGHT + HEADER_BYTES


def check_adapter_size(source: str, limit: int) -> None:
    """AdapterInvalid if the folder's weights file is larger than limit; a missing or
    unreadable one is left to the loader, which says so."""
    path = Path(source) / WEIGHTS_FILE
    try:
        size = os.stat(path).st_size
    except OSError:
        return
    if size > limit:
        raise AdapterInvalid(
            f"{path} is {size} bytes, more than any adapter this engine serves "
            f"({limit} bytes at --max-lora-rank on every projection): is it a whole model?"
        )


def check_adapter_name(name: str) -> None:
    """AdapterInvalid for a name no request could use or no picker could read."""
    if len(name) > MAX_MODEL_CHARS:
        raise AdapterInvalid(f"an adapter name is at most {MAX_MODEL_CHARS} characters")
    if any(c == "," or c.isspace() or not c.isprintable() for c in name):
        raise AdapterInvalid(
            f"adapter name {name!r}: no commas, spaces or control characters (model names)"
        )
