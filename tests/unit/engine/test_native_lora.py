"""A step's LoRA adapters on the native path (native/lora.cpp through native_layers)
against the torch path's products (lora/step_lora.py), on a small random layer."""

import pytest
import torch

from maas_kernels.native import bindings
from maas_kernels.rotary_ref import rotary_cos_sin_reference
from maas_services.engine import native_layers
from maas_services.engine.compute_path import EAGER
from maas_services.engine.lora.adapter import AdapterWeights, LowRank
from maas_services.engine.lora.step_lora import StepLora
from tests.unit.engine.test_native_layers import layer, relative_error

pytestmark = pytest.mark.skipif(
    bindings.library() is None, reason="no native library (not AVX2, or no compiler)"
)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 192, 6, 2, 32, 512
# module -> (in_features, out_features), as test_native_layers' layer has them.
MODULES = {
    "qkv_proj": (HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
    "o_proj": (HEADS * HEAD_DIM, HIDDEN),
    "gate_up_proj": (HIDDEN, 2 * INTERMEDIATE),
    "down_proj": (INTERMEDIATE, HIDDEN),
}


def adapter(seed: int, rank: int, modules=tuple(MODULES)) -> AdapterWeights:
    generator = torch.Generator().manual_seed(seed)
    pairs = {
        name: LowRank(
            torch.randn(MODULES[name][0], rank, generator=generator) * 0.1,
            torch.randn(rank, MODULES[name][1], generator=generator) * 0.1,
        )
        for name in modules
    }
    return AdapterWeights(rank, [pairs])


# Two ranks, one adapter without the attention projections: the stack pads and zeroes.
ADAPTERS = {
    "a": adapter(1, 8),
    "b": adapter(2, 4),
    "c": adapter(3, 8, modules=("gate_up_proj", "down_proj")),
}


def spans(names: list[str]) -> list[tuple[str, int, int]]:
    """One row per name, in order ("" the base)."""
    return [(name, row, row + 1) for row, name in enumerate(names)]


def halves_with(native: native_layers.Native, built, step: StepLora, x, cos, sin, attended):
    lora = step.layer(0)
    residual = torch.randn_like(x)
    inputs = native.attention_inputs(built, x, residual, cos, sin, lora)
    outputs = native.attention_outputs(built, attended, residual, lora)
    eager_inputs = EAGER.attention_inputs(built, x, residual, cos, sin, lora)
    eager_outputs = EAGER.attention_outputs(built, attended, residual, lora)
    return (*inputs, *outputs), (*eager_inputs, *eager_outputs)


class OneLayer(torch.nn.Module):
    """What Native needs of a model: model.layers and an embedding's dtype and device."""

    def __init__(self, built):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([built])
        self.model.embed_tokens = torch.nn.Embedding(4, HIDDEN)


@pytest.fixture(scope="module")
def native():
    built = layer("float32", False)
    path = native_layers.Native(OneLayer(built), "test")
    assert path.halves(built) is not None
    return built, path


def inputs(rows: int, seed: int = 0):
    torch.manual_seed(seed)
    positions = torch.randperm(400)[:rows]
    cos, sin = rotary_cos_sin_reference(positions, HEAD_DIM, 10000.0, torch.float32)
    return torch.randn(rows, HIDDEN), cos, sin, torch.randn(rows, HEADS, HEAD_DIM)


@pytest.mark.parametrize("rows", [1, 5, 40])
@torch.inference_mode()
def test_the_native_products_are_the_torch_paths(native, rows):
    """Rows of three adapters and the base, interleaved: every output of both halves
    within float32 rounding of the torch path's."""
    built, path = native
    names = [("", "a", "b", "c")[i % 4] for i in range(rows)]
    step = StepLora.build(spans(names), ADAPTERS, "cpu")
    if step is None:  # one row: the base alone
        names = ["a"]
        step = StepLora.build(spans(names), ADAPTERS, "cpu")
    x, cos, sin, attended = inputs(len(names))
    ours, reference = halves_with(path, built, step, x, cos, sin, attended)
    for got, want in zip(ours, reference, strict=True):
        assert relative_error(got, want) < 1e-5


@torch.inference_mode()
def test_base_rows_are_untouched_and_a_row_does_not_depend_on_its_step(native):
    """A base row's outputs equal the step without adapters bit for bit, and an adapter
    row's equal the same row in a step of as many rows whose other rows run other
    adapters or none (each row is computed alone: lora.h), with another thread count."""
    built, path = native
    names = ["", "a", "b", "", "c", "a"] * 4
    others = ["b", "", "a", "c", "", "b"] * 4
    x, cos, sin, attended = inputs(len(names), seed=1)
    residual = torch.randn_like(x)

    def both(lora):
        got = path.attention_inputs(built, x, residual, cos, sin, lora)
        return (*got, *path.attention_outputs(built, attended, residual, lora))

    together = both(StepLora.build(spans(names), ADAPTERS, "cpu").layer(0))
    plain = both(None)
    for row, name in enumerate(names):
        if name == "":
            for got, want in zip(together, plain, strict=True):
                assert torch.equal(got[row], want[row])
    threads = torch.get_num_threads()
    for row in (1, 2, 4):
        mixed = list(others)
        mixed[row] = names[row]
        try:
            torch.set_num_threads(1 if threads > 1 else 2)
            elsewhere = both(StepLora.build(spans(mixed), ADAPTERS, "cpu").layer(0))
        finally:
            torch.set_num_threads(threads)
        for got, want in zip(together, elsewhere, strict=True):
            assert torch.equal(got[row], want[row])
