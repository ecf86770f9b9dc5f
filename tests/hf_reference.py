"""transformers' model of our model file: the reference the engine is checked against.

transformers reads a GGUF file itself, but slowly: it parses the file's metadata
twice and builds its tensor-name map once per tensor, ~25-45 s of CPU for
SmolLM2's 135M parameters (measured), which every fixture that loaded it paid
again. The model cache's Hugging Face folder (maas_tools.peers.model_folder, the
folder vLLM serves) holds the same float32 tensors and loads in seconds;
tests/integration/engine/test_model_cache.py checks that transformers reads both
as the same model, tensor for tensor and logit for logit.
"""

from pathlib import Path

import torch

from maas_tools.peers.model_folder import hf_model_folder


def hf_reference_model(model_path: Path):
    """transformers' float32 model of model_path (a GGUF file or a Hugging Face folder)."""
    from transformers import AutoModelForCausalLM

    folder = hf_model_folder(model_path)
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
