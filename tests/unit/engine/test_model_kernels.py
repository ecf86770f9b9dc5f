"""The model's CUDA kernels (kernels/ wired in) against its torch twins, on the CPU.

The model has one path: every op goes through maas_kernels.ops, which takes the
Triton kernel for a CUDA tensor and the torch twin elsewhere.
maas_kernels.ops.force_triton() sends every op to its Triton kernel on CPU tensors
too, which Triton's interpreter runs. So a GPU-less machine checks the wiring:
the fused residual stream, rotary on the projection's views, the decode
kernel on the pool's layout and the metadata's block tables, the quantized
matmuls. Spies on the six Triton launchers prove each one ran.
"""

import os

# Before any kernel module is imported: triton.jit reads it when a kernel is
# defined (tests/unit/kernels/conftest.py does the same for its directory).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed")

from maas_kernels.ops import force_triton  # noqa: E402
from maas_services.engine.attention_metadata import AttentionMetadata  # noqa: E402
from maas_services.engine.kv_cache import PagedKVCache  # noqa: E402
from maas_services.engine.model import LlamaForCausalLM  # noqa: E402
from maas_services.engine.quantization.config import QuantizationConfig  # noqa: E402
from maas_services.engine.quantization.int4 import Int4Linear  # noqa: E402
from maas_services.engine.quantization.int8 import Int8Linear  # noqa: E402
from maas_services.engine.quantization.quantize import quantize_model  # noqa: E402

BLOCK_SIZE = 4
NUM_BLOCKS = 12
# module, launcher: what each op calls on CUDA.
LAUNCHERS = {
    "rms_norm": "rms_norm_residual_triton",
    "activation": "silu_and_mul_triton",
    "rotary": "rotary_embedding_triton",
    "paged_attention": "paged_attention_decode_triton",
    "quant_int8": "int8_matmul_triton",
    "quant_int4": "int4_matmul_triton",
}

# Three prompts, each with its own scattered (reversed, interleaved) blocks.
PROMPTS = [[3, 17, 42, 8, 8], [60, 5, 21, 33, 9, 2, 11], [7, 7, 40, 12, 50, 61, 4, 19, 23]]
TABLES = [[11, 2], [9, 4], [10, 0, 6]]
FIRST_CHUNK = 4  # the third prompt is prefilled in two chunks


def step(model, pool, ids_per_seq, starts):
    """One forward over several sequences' new tokens (decodes first); hidden states."""
    ids = [t for seq in ids_per_seq for t in seq]
    positions = torch.tensor(
        [p for seq, s in zip(ids_per_seq, starts, strict=True) for p in range(s, s + len(seq))]
    )
    lens = [len(seq) for seq in ids_per_seq]
    meta = AttentionMetadata.build(
        positions,
        query_lens=lens,
        context_lens=[s + n for s, n in zip(starts, lens, strict=True)],
        block_tables=TABLES[: len(ids_per_seq)],
        block_size=BLOCK_SIZE,
        device="cpu",
    )
    return model(torch.tensor(ids), positions, pool, meta)


@torch.inference_mode()
def two_steps(model: LlamaForCausalLM, dtype: torch.dtype):
    """A prefill-only step, then a mixed one: two decodes and the third prompt's last chunk."""
    pool = PagedKVCache.allocate(model.config, NUM_BLOCKS, BLOCK_SIZE, dtype, "cpu")
    first = step(model, pool, [PROMPTS[0], PROMPTS[1], PROMPTS[2][:FIRST_CHUNK]], [0, 0, 0])
    mixed = step(
        model,
        pool,
        [[PROMPTS[0][-1]], [PROMPTS[1][-1]], PROMPTS[2][FIRST_CHUNK:]],
        [len(PROMPTS[0]), len(PROMPTS[1]), FIRST_CHUNK],
    )
    return first, mixed, model.compute_logits(mixed), pool


@pytest.fixture
def launches(monkeypatch):
    """How many times each Triton launcher ran, by module name."""
    counts = dict.fromkeys(LAUNCHERS, 0)
    for module_name, launcher in LAUNCHERS.items():
        module = pytest.importorskip(f"maas_kernels.{module_name}")
        original = getattr(module, launcher)

        def spy(*args, _name=module_name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        # maas_kernels.ops imports the launcher from its module per call, so this is what it runs.
        monkeypatch.setattr(module, launcher, spy)
    return counts


def run_both(model: LlamaForCausalLM, dtype: torch.dtype):
    model = model.to(dtype)
    expected = two_steps(model, dtype)
    with force_triton():  # each run has a pool of its own; the weights are shared
        actual = two_steps(model, dtype)
    return actual, expected


def assert_steps_close(actual, expected, atol: float, rtol: float) -> None:
    for a, e in zip(actual[:3], expected[:3], strict=True):
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol)
    # Every new token's key and value landed in the same slots.
    for a, e in ((actual[3].k, expected[3].k), (actual[3].v, expected[3].v)):
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol)


def test_cpu_steps_run_the_torch_twins_and_never_a_kernel(tiny_model, launches):
    two_steps(tiny_model, torch.float32)
    assert set(launches.values()) == {0}


@pytest.mark.parametrize(
    ("dtype", "atol", "rtol"), [(torch.float32, 1e-5, 1e-5), (torch.float16, 2e-3, 2e-3)]
)
def test_a_mixed_step_through_the_triton_kernels_matches_the_torch_path(
    tiny_model, launches, dtype, atol, rtol
):
    actual, expected = run_both(tiny_model, dtype)
    assert_steps_close(actual, expected, atol, rtol)
    layers = tiny_model.config.num_layers
    # Per step: two norms a layer and the final one; rotary once a layer. Decode
    # attention only in the mixed step; prefill chunks stay on SDPA.
    assert launches["rms_norm"] == 2 * (2 * layers + 1)
    assert launches["rotary"] == launches["activation"] == 2 * layers
    assert launches["paged_attention"] == layers
    assert launches["quant_int8"] == launches["quant_int4"] == 0


@pytest.mark.parametrize(
    ("method", "linear", "kernel"),
    [("int8", Int8Linear, "quant_int8"), ("int4", Int4Linear, "quant_int4")],
)
def test_quantized_layers_run_the_dequant_matmul_kernels(
    tiny_model, launches, method, linear, kernel
):
    # float32 on the CPU keeps the portable layers (the ones CUDA gets), whose
    # matmul is maas_kernels.int8_matmul / int4_matmul; group 32 divides the tiny sizes.
    with torch.no_grad():
        model = quantize_model(tiny_model, QuantizationConfig(method, 32), torch.float32)
    assert isinstance(model.model.layers[0].mlp.down_proj, linear)
    actual, expected = run_both(model, torch.float32)
    assert_steps_close(actual, expected, atol=1e-5, rtol=1e-5)
    # Four projections a layer in each of two steps, and the LM head (int8 for both
    # methods) once.
    head = {"quant_int8": 1, "quant_int4": 0}[kernel]
    assert launches[kernel] == 2 * 4 * tiny_model.config.num_layers + head
