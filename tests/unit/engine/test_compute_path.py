"""One compute path per engine, chosen once from the settings and the model, with why."""

import ctypes

import pytest
import torch

from maas_kernels.native import bindings
from maas_services.engine.compute_path import ComputePath
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.model_runner import ModelRunner, choose_path
from maas_services.engine.native_layers import Native

needs_library = pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)


@needs_library
def test_a_float32_cpu_model_runs_the_native_path(tiny_model):
    path = choose_path(tiny_model, compiled=False, native=True)
    assert isinstance(path, Native) and path.native_layers == 2
    assert path.describe()["compute_path"] == "native"
    # Nothing patched onto the modules: the model's own methods are the torch halves.
    assert all("attention_inputs" not in vars(each) for each in tiny_model.model.layers)


def test_no_native_layers_and_bfloat16_run_eagerly_and_say_why(tiny_model):
    off = choose_path(tiny_model, compiled=False, native=False)
    assert type(off) is ComputePath and off.reason == "--no-native-layers"
    bf16 = choose_path(tiny_model.to(torch.bfloat16), compiled=False, native=True)
    assert type(bf16) is ComputePath and "bfloat16" in bf16.reason
    assert bf16.describe() == {
        "compute_path": "eager",
        "compute_path_reason": bf16.reason,
        "native_layers": 0,
    }


def test_the_runner_owns_the_path_it_chose(tiny_model, tiny_config):
    pool = PagedKVCache.allocate(tiny_config, 4, 4, torch.float32, "cpu")
    runner = ModelRunner(
        tiny_model,
        tiny_config,
        pool,
        "cpu",
        path=choose_path(tiny_model, compiled=False, native=False),
    )
    assert runner.path.name == "eager"


@needs_library
def test_a_structure_layout_other_than_the_cpp_one_fails_the_load(monkeypatch):
    lib = bindings.library()
    assert bindings.bind(lib) is lib  # idempotent: the real layout matches
    wrong = [*bindings.expected_layout()[:-1], 0]
    monkeypatch.setattr(bindings, "expected_layout", lambda: wrong)
    with pytest.raises(RuntimeError, match="layout"):
        bindings.bind(lib)


def test_every_structure_field_is_reported_by_the_cpp_side():
    # native_layout() lists sizeof and each field's offset of every structure, in order.
    structures = (bindings.Weight, bindings.Layer, bindings.LowRank, bindings.Lora)
    fields = sum(len(structure._fields_) for structure in structures)
    assert len(bindings.expected_layout()) == fields + len(structures)
    assert bindings.expected_layout()[0] == ctypes.sizeof(bindings.Weight)
