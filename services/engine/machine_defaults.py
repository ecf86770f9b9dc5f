"""The engine's `auto` settings, chosen for the machine it runs on (issue #13 step 5).

`derive` is the rule: from what the CPU has (flags, cores, a cgroup CPU
limit) or that the model runs on CUDA, it picks the dtype, the core
process's compute threads, OpenMP's wait policy, the quantization default
and the batch above which speculative decoding stops, and from how many rows
a step computes on every core. `resolve` applies it
to settings: a flag or environment variable that names a value always
wins; only `auto` (0 for the counts) is filled in. The serving process
resolves once before starting the core and logs the outcome as one
`engine_machine_defaults` line, with why each value was chosen.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.machine_profile import BF16_FLAGS, MachineProfile
from services.engine.settings import EngineSettings

OMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

# Decode rows a forward verifies before it stops being bound by reading the
# weights and starts costing like more steps: speculation stops where the
# batch's drafts reach it. Measured on the 2-core AMD EPYC (avx2, float32):
# n-gram speculation with 4 draft tokens paid up to batch 4 (20 rows,
# 1.17-1.32x) and lost at batch 8 (0.85x; docs/speculative.md). The others
# scale it by matmul throughput against memory bandwidth: AVX-512 doubles
# the FMA width, native bf16 halves the bytes read per weight and AMX
# multiplies the FLOP/s again, a GPU's ratio is some 10x a CPU's. Estimates.
VERIFY_ROWS = {"avx2": 20, "avx512": 40, "bf16": 80, "cuda": 320}
# Rows a step computes (decode rows + prefill tokens) from which it runs on
# every core. On the 2-core AMD EPYC (avx2), through the whole stack on a quiet
# machine, two threads gained 14% at 32 streams (issue #13's table: 138.7 vs
# 121.5 tok/s), 6% at 8 (session 4: 47.4 vs 44.7) and lost 11% at one (11.0
# vs 12.4); beside other work (load 5-7) they lost at every batch from 1 to
# 64, float32 and int8 (benchmarks/results/step_threads_*.json). 32 is where the
# quiet gain is clear; below it a preemption costs more than the core adds.
# With the step native (session 8) a free second core sped 1-16-row steps up
# 1.15-1.6x in one process, and lost 4-14% when another process held a core;
# through the stack (1 and 8 streams, two rounds, load 2-3.5) two threads did
# not beat one (benchmarks/results/narrow_threads*.json, peers_narrow_threads*.json).
WIDE_ROWS = 32


@dataclass(frozen=True)
class Choice:
    value: Any
    why: str
    source: str = "auto"  # or "flag" (a flag or MAAS_ variable), "env" (OpenMP's own)


def machine_dtype(machine: MachineProfile, on_cuda: bool) -> Choice:
    if on_cuda:
        return Choice("bfloat16", "CUDA: bfloat16 tensor cores, half the weight bytes")
    if machine.native_bf16:
        have = ", ".join(sorted(BF16_FLAGS & machine.flags))
        return Choice("bfloat16", f"the CPU has native bf16 matmuls ({have})")
    return Choice("float32", "no amx_bf16/avx512_bf16: bf16 matmuls would be emulated, slower")


def _threads(machine: MachineProfile) -> Choice:
    """Every compute core: a wide step uses them all, a narrower one all but one (_wide_rows)."""
    cores = machine.compute_cores
    why = f"{machine.physical_cores} physical cores of the {machine.cpus} CPUs it may run on"
    if machine.cpu_quota is not None:
        why += f", cgroup limit {machine.cpu_quota:g} CPUs"
    return Choice(cores, why)


def _wide_rows(machine: MachineProfile, on_cuda: bool) -> Choice:
    """Rows from which a step computes on every core instead of leaving one to the serving side.

    An OpenMP team waits at each op for its slowest thread, so one thread
    preempted by the serving process (it wakes for every token) or a
    neighbour stalls the whole step: on the 2-core AMD EPYC (avx2) one core
    thread beat two at 1 and 8 streams (core_threads_bench, docs/engine.md).
    A wide step's matmuls are long and compute-bound: a preemption costs them
    little and the last core adds nearly its share.
    """
    if on_cuda:
        return Choice(1, "CUDA computes the step; the CPU threads only launch it")
    if machine.compute_cores == 1:
        return Choice(1, "one core: nothing to leave over")
    return Choice(
        WIDE_ROWS,
        f"from {WIDE_ROWS} rows every core gained on the quiet 2-core AVX2 EPYC (docs/engine.md); "
        "narrower steps leave one core to the serving process",
    )


def _omp() -> Choice:
    # Even with one compute thread: it covers any team opened before torch's
    # thread count is set, and the test workers' engines keep out of each other's way.
    return Choice(
        {"OMP_WAIT_POLICY": "PASSIVE"},
        "idle OpenMP threads sleep: with 2 threads on the 2-core AMD EPYC, spinning "
        "(GOMP_SPINCOUNT=100000, ACTIVE) lost to passive at 1 stream in every pair (load 8-16)",
    )


def _quantization() -> Choice:
    # The AVX2 int8/int4 kernels (quantization/cpu_kernel.py) are faster than float32
    # at 1-256 rows (benchmarks/results/quant_kernel.json, quant_avx2_panels.json) and
    # within the perplexity gate, but picking them by machine would also need the model's GGUF
    # blocks (int4 is lossless only from Q4_0/Q4_1), a C++ compiler at run time
    # (the runtime image has none), and the operator to pass "none" explicitly.
    return Choice(
        "none",
        "quantization changes the served weights; it stays an explicit choice "
        "(docs/quantization.md has the measured speed and perplexity per CPU)",
    )


def _spec_max_batch(machine: MachineProfile, on_cuda: bool, draft_tokens: int, cap: int) -> Choice:
    if on_cuda:
        kind = "cuda"
    elif machine.native_bf16 or machine.amx:
        kind = "bf16"
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
        "torch_threads": _threads(machine),
        "compute_wide_rows": _wide_rows(machine, on_cuda),
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
_AUTO = {"dtype": "auto", "torch_threads": 0, "compute_wide_rows": 0, "speculative_max_batch": 0}


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
    omp = {name: environ[name] for name in OMP_VARIABLES if name in environ}
    choices["omp"] = Choice(omp, "given", "env") if omp else derived["omp"]
    updates = {name: choices[name].value for name in (*_AUTO, "quantization")}
    return Resolved(
        settings=settings.model_copy(update=updates),
        core_env={} if omp else dict(choices["omp"].value),
        choices=choices,
    )
