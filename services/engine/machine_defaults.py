"""The engine's `auto` settings, chosen for the machine it runs on (issue #13 step 5).

`derive` is the rule: from what the CPU has (flags, cores, a cgroup CPU
limit) or that the model runs on CUDA, it picks the dtype, the native layers'
wide GEMM (float32 or bf16), the core process's compute threads, OpenMP's wait
policy, the quantization default and the batch above which speculative
decoding stops, and from how many rows a step computes on every core. `resolve` applies it
to settings: a flag or environment variable that names a value always
wins; only `auto` (0 for the counts) is filled in. The serving process
resolves once before starting the core and logs the outcome as one
`engine_machine_defaults` line, with why each value was chosen.
"""

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from maas_services.common.machine_profile import MachineProfile
from maas_services.engine.settings import EngineSettings

OMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# The core's OpenMP: libgomp's default policy (spin, then sleep) with a short spin, ~0.1-0.5
# ms depending on the CPU's pause. A decode step is one native call of ~120 parallel
# regions microseconds apart: sleeping threads (OMP_WAIT_POLICY=PASSIVE, the default until
# session 13) took a futex wake-up each, 45-65 us on a 2-core AMD EPYC family 26 (Zen 5):
# 30 layers of int8 row kernels in 9.3-11.6 ms instead of 3.5-3.9. Through the stack,
# ABBA on that machine, int8 served 112 / 131 output tok/s at 1 stream against PASSIVE's
# 61 / 67, and 243 / 339 at 8 against 238 / 249; float32 42 / 33 against 30 / 32 at 1. The
# spin ends well before the next step, so between steps the cores go to the serving side;
# sessions 4-8 measured spinning losing on a machine loaded 8-16 by other work, with ~2,700
# torch ops a step: set OMP_WAIT_POLICY=PASSIVE there (the environment's value wins).
CORE_OMP = {"GOMP_SPINCOUNT": "10000"}

# Decode rows a forward verifies before it stops being bound by reading the
# weights and starts costing like more steps: speculation stops where the
# batch's drafts reach it. Measured on the 2-core AMD EPYC (avx2, float32):
# n-gram speculation with 4 draft tokens paid up to batch 4 (20 rows,
# 1.17-1.32x) and lost at batch 8 (0.85x; docs/speculative.md). The others
# scale it by matmul throughput against memory bandwidth: AVX-512 doubles
# the FMA width (an AMX machine serves float32 too: DTYPE_BY_CPU_CLASS), a
# GPU's ratio is some 10x a CPU's. Estimates.
VERIFY_ROWS = {"avx2": 20, "avx512": 40, "cuda": 320}
# Rows a step computes (decode rows + prefill tokens) from which it runs on
# every core: every step. Narrow steps had been left one core fewer, for the
# serving process (sessions 4-8: through the stack a team of two lost to one
# thread at 1 and 8 streams, beside other work). With the decode step one
# native call and int8 dot products (session 9), on a quiet 2-core AMD EPYC
# (first-generation Zen, avx2; session 11), every step on both cores served
# 1.24x the tokens/s at 1 stream and 1.35x at 8 in int8 (three runs each, both
# orders), 1.27x and 1.46x in float32 (two, ABBA; docs/engine.md).
# --compute-wide-rows 32 keeps the old choice for a machine whose other work
# holds a core.
WIDE_ROWS = 1


@dataclass(frozen=True)
class Choice:
    value: Any
    why: str
    source: str = "auto"  # or "flag" (a flag or MAAS_ variable), "env" (OpenMP's own)


@dataclass(frozen=True)
class Measured:
    """A CPU class's default for a setting, and the measurement that chose it."""

    value: str
    measured: str


# One row per CPU class, each chosen by measuring that class through the stack (seeded
# prompts, 128 tokens, output tok/s at 1 / 8 / 32 streams). bf16 on a CPU runs the model
# as torch ops; float32 runs the native decode layers (native/), which no CPU class has
# yet lost to bf16's torch ops. A class that gains native bf16 layers is measured again.
DTYPE_BY_CPU_CLASS = {
    "amx": Measured(
        "float32",
        "Intel Xeon family 6 model 207 (2 cores, AMX bf16/int8; issue #32): float32's native "
        "layers 21.6 / 106.8 / 190.4 against bf16's torch ops 17.5 / 101.9 / 186.2",
    ),
    "avx512_bf16": Measured(
        "float32",
        "AMD EPYC family 26 model 2 (Zen 5, avx512_bf16, no AMX; session 13): float32 "
        "1.86x / 1.71x bf16's tok/s at 1 / 8 streams (docs/bench.md)",
    ),
    "avx512": Measured("float32", "no bf16 dot products: bf16 matmuls would be emulated"),
    "avx2": Measured(
        "float32",
        "no bf16 dot products: a bf16 torch.mm measured below 1 GFLOP/s against float32's "
        "145 on a 2-core AVX2 EPYC",
    ),
}

# The native layers' and LM head's matmuls (--wide-gemm), per CPU class. bf16
# (native/bf16.h) where the CPU has bf16 dot products and every width sums alike: the
# panel GEMM for wide steps, bf16_rows for narrow ones, the same sums for every output,
# so a request's tokens do not depend on how many others share its step (as float32's).
# With AMX the tiles sum in their own order, which the rows do not follow. int8 (opt-in):
# bf16 where a weight has no checkpoint blocks; where it has, every step multiplies them
# by activations rounded to int8 (one kernel at every width, so batch-invariant too).
WIDE_GEMM_BY_CPU_CLASS = {
    "amx": Measured(
        "float32",
        "the AMX tile panel (native/amx_panel.cpp) has not run on an AMX CPU, and its tiles "
        "sum in their own order, not bf16_rows': bf16 is opt-in there",
    ),
    "avx512_bf16": Measured(
        "bf16",
        "every width sums alike (bf16_rows for narrow steps, the panel's sums); through the "
        "stack (make bench-peers, AMD EPYC family 25 model 17, Zen 4, avx512_bf16, no AMX, "
        "quiet, one run) 56.4 / 240.5 / 500.0 / 547.3 output tok/s at 1 / 8 / 32 / 64 "
        "streams against --wide-gemm float32's 37.1 / 160.3 / 354.9 / 396.5 and vLLM "
        "bf16's 37.4 / 228.0 / 362.5 / 408.7 (benchmarks/results/peers_zen4.json); "
        "known-answer perplexity +0.02% off float32's. int8 (session 31) is faster still "
        "(decode steps 1.3-1.5x at 8-16 rows, 1.1x at 32-64) but rounds the activations ~6x "
        "more coarsely than bf16 (known-answer +0.13%; it flips SmolLM2's float32 near-tie "
        "on 'What is the capital of France?', as llama.cpp's Q8 activations do, and a "
        "stream resumed on another replica parted from its uninterrupted answer in both "
        "migration tests): opt-in, as quantization is",
    ),
    "avx512": Measured("float32", "no bf16 dot products: the library has no bf16 panel"),
    "avx2": Measured("float32", "no bf16 dot products: the library has no bf16 panel"),
}


# The weights the native kernels multiply by (--kernel-weights), per CPU class: a float32
# model's GGUF blocks as they are (quantization/checkpoint_blocks.py), the same weights in
# an eighth or a quarter of the bytes, where measured faster.
KERNEL_WEIGHTS_BY_CPU_CLASS = {
    "amx": Measured("float32", "not measured on an AMX CPU yet"),
    "avx512_bf16": Measured(
        "checkpoint",
        "AMD EPYC family 25 model 17 (Zen 4, avx512_bf16, avx512_vnni; session 30): steps of "
        "up to 12 rows from SmolLM2's Q4_1 and Q8_0 blocks (int16 activations, the "
        "interleaved layout), wider ones from the bf16 copy: whole decode steps 2.15x / "
        "2.18x / 1.87x / 1.54x / 1.22x faster than the bf16 copy's at 1 / 4 / 6 / 8 / 12 "
        "rows (ABBA in one process); through the stack 132.8 / 380.5 output tok/s at 1 / 8 "
        "streams against session 22's 71.3 / 277.6 from the bf16 copies "
        "(benchmarks/results/peers_zen4_s30.json); the same weights, +111 MB",
    ),
    "avx512": Measured("float32", "not measured on an AVX-512 CPU without bf16 yet"),
    "avx2": Measured(
        "checkpoint",
        "AMD EPYC family 25 model 1 (Zen 3, avx2; sessions 24-25): SmolLM2's Q4_1 layers and "
        "Q8_0 head, float32 activations, against float32 weights: whole decode steps 3.3x / "
        "2.1x / 1.34x faster at 1 / 4 / 8 rows and 1.04-1.26x at 9-32 (benchmarks.step_bench "
        "--blocks-ab); through the stack 3.09x / 1.19x / 1.10x / 1.09x output tok/s at 1 / 8 "
        "/ 32 / 64 streams (benchmarks/results/peers_zen3_s24.json); the same weights, +111 MB",
    ),
}


# How the checkpoint blocks' row kernel takes the activations (--kernel-activations), per
# CPU class: as they are, or rounded to int16 per block of 32 for integer dot products.
KERNEL_ACTIVATIONS_BY_CPU_CLASS = {
    "amx": Measured("float32", "not measured on an AMX CPU yet (its blocks are not the default)"),
    "avx512_bf16": Measured(
        "int16",
        "the interleaved blocks' kernel takes only int16 activations (vpdpwssd); float32 "
        "activations run the row-major blocks' float kernel: 0.79x the bf16 copy's whole "
        "decode steps at 8 rows where int16's interleaved ones ran 1.54x (Zen 4, session 30)",
    ),
    "avx512": Measured("float32", "not measured on an AVX-512 CPU without bf16 yet"),
    "avx2": Measured(
        "int16",
        "AMD EPYC family 25 model 1 (Zen 3, avx2; session 29): whole decode steps from "
        "SmolLM2's Q4_1 and Q8_0 blocks 1.12x / 1.18x / 1.16x faster at 1 / 4 / 8 rows, "
        "ABBA in one process; greedy tokens as float32's but at one near-tie in 3,072 "
        "(transformers' top two 1.5e-4 apart at 19.87); each activation within 1/65534 "
        "of its block's largest (bf16 rounds each to 1/512 of itself)",
    ),
}


# The KV pool's entries (--kv-cache-dtype), per CPU class: bf16 halves the bytes a
# decode's attention reads (memory-bound: native/attention.cpp widens them with AVX2, so
# any class could), but a class takes it only once measured there.
KV_CACHE_DTYPE_BY_CPU_CLASS = {
    "amx": Measured("model", "not measured on an AMX CPU yet"),
    "avx512_bf16": Measured(
        "bf16",
        "AMD EPYC family 25 model 17 (Zen 4, avx512_bf16, no AMX; session 22): whole decode "
        "steps, float32 pool over bf16, ABBA in one process (benchmarks.attention_bench "
        "--section pool, 80-token prompts, three runs) 1.06x / 1.10-1.14x / 1.13-1.20x at "
        "8 / 32 / 64 rows, 1.37x at 32 rows of 400-token prompts; through the stack, three "
        "runs in both orders, medians 1.03x / 1.05x / 1.08x / 1.10x output tok/s at 1 / 8 / "
        "32 / 64 streams; known-answer perplexity -0.1% off float32's; twice the tokens a byte",
    ),
    "avx512": Measured("model", "not measured on an AVX-512 CPU without bf16 yet"),
    "avx2": Measured(
        "model",
        "AMD EPYC family 25 model 1 (Zen 3, avx2; session 23): whole decode steps 1.00-1.11x "
        "faster over a bf16 pool (benchmarks.attention_bench --section pool), but this "
        "class's float32 kernels sum a row in another order at a few rows than in a wide "
        "step, and rounding the keys and values to bf16 turns those last-bit differences "
        "into 2^-8 ones: a batch line then answered otherwise than the same request alone "
        "(tests/e2e/test_batches_sdk.py). The avx512_bf16 class's bf16 matmuls sum alike "
        "at every width, so its rounding is too",
    ),
}


def cpu_class(machine: MachineProfile) -> str:
    """The row of DTYPE_BY_CPU_CLASS (and of docs/bench.md's tables) this CPU belongs to."""
    if machine.amx:
        return "amx"
    if machine.native_bf16:
        return "avx512_bf16"
    return "avx512" if "avx512f" in machine.flags else "avx2"


def _measured(table: dict[str, "Measured"], machine: MachineProfile) -> Choice:
    """The table's row for this CPU's class, with what was measured there."""
    kind = cpu_class(machine)
    row = table[kind]
    return Choice(row.value, f"{kind} CPU, measured: {row.measured}")


def machine_dtype(machine: MachineProfile, on_cuda: bool) -> Choice:
    if on_cuda:
        return Choice("bfloat16", "CUDA: bfloat16 tensor cores, half the weight bytes")
    return _measured(DTYPE_BY_CPU_CLASS, machine)


def _native_layers(table: dict[str, "Measured"], machine: MachineProfile, on_cuda: bool) -> Choice:
    """A native-layer table's row (--wide-gemm, --kernel-weights, --kernel-activations);
    float32 on CUDA."""
    if on_cuda:
        return Choice("float32", "CUDA: the native layers do not run")
    return _measured(table, machine)


def machine_kv_cache_dtype(machine: MachineProfile, on_cuda: bool) -> Choice:
    if on_cuda:
        return Choice("model", "CUDA: the Triton attention reads the model's dtype")
    return _measured(KV_CACHE_DTYPE_BY_CPU_CLASS, machine)


def _threads(machine: MachineProfile) -> Choice:
    """Every compute core: a wide step uses them all, a narrower one all but one (_wide_rows)."""
    cores = machine.compute_cores
    why = f"{machine.physical_cores} physical cores of the {machine.cpus} CPUs it may run on"
    if machine.cpu_quota is not None:
        why += f", cgroup limit {machine.cpu_quota:g} CPUs"
    return Choice(cores, why)


def _wide_rows(on_cuda: bool) -> Choice:
    """Rows from which a step computes on every core instead of leaving one to the serving side.

    An OpenMP team waits at each op for its slowest thread, so a thread
    preempted by the serving process or a neighbour stalls the whole step;
    measured through the stack, the second core now pays more than that costs.
    """
    if on_cuda:
        return Choice(1, "CUDA computes the step; the CPU threads only launch it")
    return Choice(
        WIDE_ROWS,
        "every step on every core: through the stack on the quiet 2-core AVX2 EPYC it served "
        "1.24-1.46x the tokens/s of narrow steps on one core fewer (docs/engine.md)",
    )


def _given_omp(environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenMP variables the environment sets: any of them replaces CORE_OMP whole."""
    return {name: environ[name] for name in OMP_VARIABLES if name in environ}


def use_core_omp(environ: MutableMapping[str, str] = os.environ) -> None:
    """The core's OpenMP settings in this process, for a benchmark that runs the engine in
    it; call before torch loads OpenMP. As in resolve, OpenMP variables given win."""
    if not _given_omp(environ):
        environ.update(CORE_OMP)


def _omp() -> Choice:
    return Choice(
        dict(CORE_OMP),
        "OpenMP threads spin briefly between a step's parallel regions, then sleep: a decode "
        "step is ~120 of them, and waking a sleeping thread for each cost 1.9x int8's "
        "tokens/s at 1 stream (docs/engine.md)",
    )


def _quantization() -> Choice:
    # The AVX2 int8/int4 kernels (quantization/cpu_kernel.py) are faster than float32
    # at 1-256 rows (benchmarks/results/quant_kernel.json, quant_avx2_panels.json) and
    # within the perplexity gate, but picking them by machine would also need the model's GGUF
    # blocks (int4 is lossless only from Q4_0/Q4_1), a C++ compiler at run time
    # (the runtime image has none), and the operator to pass "none" explicitly.
    # Measured on an AVX2 Zen 3 EPYC (session 23, docs/bench.md): SmolLM2's own blocks
    # (int4 group 32 and the Q8_0 head, exactly its weights) with float32 activations served
    # 1.80x float32's tok/s at 1 stream but 0.88x / 0.80x / 0.92x at 8 / 32 / 64 (their wide
    # panels are dequantized per call); with int8 activations 2.8x / 1.4x / 1.03x at 1 / 8 /
    # 32, but those flip near-ties ("What is the capital of France?" answers "L'Étoile") and
    # make a request's tokens depend on its step's width. So neither is a default; the
    # float32 engine reads the same blocks instead (--kernel-weights checkpoint), with its
    # own wide path (session 25: the blocks' panels faster than float32's at 9-64 rows).
    return Choice(
        "none",
        "quantization changes the served weights; it stays an explicit choice "
        "(docs/quantization.md has the measured speed and perplexity per CPU)",
    )


def _spec_max_batch(machine: MachineProfile, on_cuda: bool, draft_tokens: int, cap: int) -> Choice:
    if on_cuda:
        kind = "cuda"
    elif "avx512f" in machine.flags:
        kind = "avx512"
    else:
        kind = "avx2"
    rows = VERIFY_ROWS[kind]
    batch = max(1, min(cap, rows // (draft_tokens + 1)))
    return Choice(
        batch, f"{kind}: ~{rows} rows per step stay weight-bound, {draft_tokens + 1} per sequence"
    )


def derive(
    machine: MachineProfile, on_cuda: bool, draft_tokens: int, max_num_seqs: int
) -> dict[str, Choice]:
    """Every `auto` value for this machine, with why; a pure function of its arguments."""
    return {
        "dtype": machine_dtype(machine, on_cuda),
        "wide_gemm": _native_layers(WIDE_GEMM_BY_CPU_CLASS, machine, on_cuda),
        "kernel_weights": _native_layers(KERNEL_WEIGHTS_BY_CPU_CLASS, machine, on_cuda),
        "kernel_activations": _native_layers(KERNEL_ACTIVATIONS_BY_CPU_CLASS, machine, on_cuda),
        "kv_cache_dtype": machine_kv_cache_dtype(machine, on_cuda),
        "torch_threads": _threads(machine),
        "compute_wide_rows": _wide_rows(on_cuda),
        "omp": _omp(),
        "quantization": _quantization(),
        "speculative_max_batch": _spec_max_batch(machine, on_cuda, draft_tokens, max_num_seqs),
    }


@dataclass(frozen=True)
class Resolved:
    settings: EngineSettings  # no `auto` left
    core_env: dict[str, str]  # OpenMP variables the core process starts with
    choices: dict[str, Choice]

    def log_fields(self, machine: MachineProfile) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "cpu_model": machine.cpu_model,
            "cpu_flags": machine.simd_flags,
            "cpus": machine.cpus,
            "physical_cores": machine.physical_cores,
            "cpu_quota": machine.cpu_quota,
            "gpu": machine.gpu,
        }
        for name, choice in self.choices.items():
            fields[name] = choice.value
            fields[f"{name}_why"] = f"{choice.source}: {choice.why}"
        return fields


# Settings whose `auto` this module fills in, and the value that means `auto`.
_AUTO = {
    "dtype": "auto",
    "wide_gemm": "auto",
    "kernel_weights": "auto",
    "kernel_activations": "auto",
    "kv_cache_dtype": "auto",
    "torch_threads": 0,
    "compute_wide_rows": 0,
    "speculative_max_batch": 0,
}


def resolve(
    settings: EngineSettings, machine: MachineProfile, on_cuda: bool, environ: Mapping[str, str]
) -> Resolved:
    derived = derive(machine, on_cuda, settings.num_speculative_tokens, settings.max_num_seqs)
    choices: dict[str, Choice] = {}
    for name, auto in _AUTO.items():
        given = getattr(settings, name)
        choices[name] = derived[name] if given == auto else Choice(given, "given", "flag")
    # Not given means the machine's choice. It is "none" on every machine yet, so the
    # setting keeps "none" as its default; before it can be anything else the operator
    # must pass --quantization=none for a ModelDeployment that asks for none.
    given = "quantization" in settings.model_fields_set
    choices["quantization"] = (
        Choice(settings.quantization, "given", "flag") if given else derived["quantization"]
    )
    omp = _given_omp(environ)
    choices["omp"] = Choice(omp, "given", "env") if omp else derived["omp"]
    updates = {name: choices[name].value for name in (*_AUTO, "quantization")}
    return Resolved(
        settings=settings.model_copy(update=updates),
        core_env={} if omp else dict(choices["omp"].value),
        choices=choices,
    )
