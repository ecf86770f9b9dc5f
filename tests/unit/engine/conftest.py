"""A tiny random Llama: the engine's code paths in milliseconds, with no weights file.

And the engine's native library as a machine without a C++ compiler has it.
"""

import pytest
import torch

from maas_kernels.native import bindings
from maas_kernels.native import library as native
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(
        architecture="llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_model_len=24,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
    )


@pytest.fixture
def tiny_model(tiny_config) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config).eval()
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.3)
    return model


@pytest.fixture
def without_a_compiler(monkeypatch, tmp_path):
    """No native library (library() None) for the test: an empty cache, no compiler."""
    monkeypatch.setenv("MAAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(native, "PREBUILT", tmp_path)
    # The loaded library and its bound copy are cached: both forget it.
    cached = (native.library, bindings.library)
    for library in cached:
        library.cache_clear()
    yield
    for library in cached:
        library.cache_clear()
