"""The engine's per-machine defaults: derived from what the machine has; given values win."""

import json

import pytest
from structlog.testing import capture_logs

from maas_services.common.machine_profile import MachineProfile
from maas_services.common.settings import parse_settings
from maas_services.engine.core.launcher import resolve_for_core
from maas_services.engine.machine_defaults import (
    DTYPE_BY_CPU_CLASS,
    KERNEL_WEIGHTS_BY_CPU_CLASS,
    KV_CACHE_DTYPE_BY_CPU_CLASS,
    WIDE_GEMM_BY_CPU_CLASS,
    WIDE_ROWS,
    cpu_class,
    derive,
    resolve,
    use_core_omp,
)
from maas_services.engine.settings import EngineSettings
from maas_tools.local.up import machine_defaults

# The CI machine: 2 cores, AVX2, no AVX-512, no AMX.
EPYC = MachineProfile(
    "AMD EPYC", frozenset({"fma", "avx", "avx2", "f16c"}), cpus=2, physical_cores=2
)
# A Sapphire Rapids Xeon: 2 x 8 cores with hyperthreads, AMX and AVX512-BF16.
XEON = MachineProfile(
    "Intel(R) Xeon(R) Platinum 8480+",
    frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}),
    cpus=32,
    physical_cores=16,
)
# A Zen 5 EPYC: AVX-512 with bf16 dot products, no AMX.
ZEN5 = MachineProfile(
    "AMD EPYC",
    frozenset({"fma", "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni"}),
    cpus=2,
    physical_cores=2,
)
GPU_HOST = MachineProfile(
    "AMD EPYC 9654", frozenset({"avx2", "avx512f"}), 16, 16, gpu="NVIDIA H200"
)


@pytest.fixture(autouse=True)
def _auto_settings(monkeypatch):
    # A test run may pin its engines' threads (MAAS_TORCH_THREADS); here they must be auto.
    for name in ("MAAS_TORCH_THREADS", "MAAS_COMPUTE_WIDE_ROWS"):
        monkeypatch.delenv(name, raising=False)


def values(machine: MachineProfile, on_cuda: bool = False) -> dict:
    return {
        name: choice.value
        for name, choice in derive(machine, on_cuda, draft_tokens=4, max_num_seqs=64).items()
    }


def test_an_avx2_epyc_computes_every_step_in_float32_on_both_cores():
    assert values(EPYC) == {
        "dtype": "float32",
        "wide_gemm": "float32",
        # A GGUF's own blocks in every step: the same weights, an eighth of the bytes.
        "kernel_weights": "checkpoint",
        # Their row kernel on activations rounded to int16: integer dot products.
        "kernel_activations": "int16",
        # Measured faster here, but its float32 kernels' sums depend on a step's width,
        # which rounding to bf16 would turn into different tokens: the model's dtype.
        "kv_cache_dtype": "model",
        "torch_threads": 2,
        # Through the stack the second core paid 1.24-1.46x even at 1 stream.
        "compute_wide_rows": 1,
        # A decode step's ~120 parallel regions: a short spin spares each a wake-up.
        "omp": {"GOMP_SPINCOUNT": "10000"},
        "quantization": "none",
        # Measured here: n-gram speculation paid up to batch 4 and lost at 8.
        "speculative_max_batch": 4,
    }


def test_an_amx_xeon_serves_float32_native_layers_on_its_physical_cores():
    # Measured there (issue #32): bf16's torch ops were the slowest variant at 1-32 streams.
    chosen = derive(XEON, False, draft_tokens=4, max_num_seqs=64)
    assert (chosen["dtype"].value, chosen["torch_threads"].value) == ("float32", 16)
    assert chosen["dtype"].why.startswith("amx CPU, measured: Intel Xeon")
    assert chosen["speculative_max_batch"].value > values(EPYC)["speculative_max_batch"]


def test_avx512_bf16_without_amx_computes_wide_steps_in_bf16_and_narrow_ones_from_blocks():
    chosen = derive(ZEN5, False, draft_tokens=4, max_num_seqs=64)
    assert chosen["dtype"].value == "float32"
    assert chosen["dtype"].why.startswith("avx512_bf16 CPU, measured:")
    # bf16 dot products, and every width sums alike (bf16_rows); AMX keeps float32.
    assert chosen["wide_gemm"].value == "bf16"
    assert values(XEON)["wide_gemm"] == "float32"
    # Half the bytes a decode's attention reads, measured on this class.
    assert chosen["kv_cache_dtype"].value == "bf16"
    assert chosen["kv_cache_dtype"].why.startswith("avx512_bf16 CPU, measured:")
    assert values(XEON)["kv_cache_dtype"] == "model"
    # Narrow steps from the checkpoint's blocks (int16 activations), measured on this
    # class and the AVX2 one; the AMX Xeon's read the float32 weights.
    assert (chosen["kernel_weights"].value, chosen["kernel_activations"].value) == (
        "checkpoint",
        "int16",
    )
    assert values(XEON)["kernel_weights"] == "float32"
    # Wider FMAs than the AVX2 machine's, float32 weights as on the AMX Xeon.
    assert (
        values(EPYC)["speculative_max_batch"]
        < chosen["speculative_max_batch"].value
        == values(XEON)["speculative_max_batch"]
    )


def test_every_cpu_class_has_a_measured_row():
    assert {cpu_class(m) for m in (EPYC, XEON, ZEN5, GPU_HOST)} == set(DTYPE_BY_CPU_CLASS)
    tables = (DTYPE_BY_CPU_CLASS, WIDE_GEMM_BY_CPU_CLASS, KV_CACHE_DTYPE_BY_CPU_CLASS)
    for table in (*tables, KERNEL_WEIGHTS_BY_CPU_CLASS):
        assert set(table) == set(DTYPE_BY_CPU_CLASS)
        assert all(row.measured for row in table.values())


def test_a_cuda_device_serves_bfloat16_and_speculates_up_to_the_batch_cap():
    chosen = values(GPU_HOST, on_cuda=True)
    assert chosen["dtype"] == "bfloat16"
    assert (chosen["kv_cache_dtype"], chosen["kernel_weights"]) == ("model", "float32")
    assert chosen["speculative_max_batch"] == 64
    # The GPU computes; the CPU threads need no switching.
    assert chosen["compute_wide_rows"] == 1
    assert (
        derive(GPU_HOST, True, draft_tokens=4, max_num_seqs=8)["speculative_max_batch"].value == 8
    )


def test_a_one_core_machine_or_pod_computes_on_its_one_core():
    one_core = MachineProfile("AMD EPYC", EPYC.flags, cpus=1, physical_cores=1)
    assert (values(one_core)["torch_threads"], values(one_core)["compute_wide_rows"]) == (1, 1)
    limited = MachineProfile("AMD EPYC", EPYC.flags, cpus=64, physical_cores=32, cpu_quota=4.0)
    assert values(limited)["torch_threads"] == 4


def test_engine_settings_resolve_auto_through_the_machine():
    settings = parse_settings(EngineSettings, [], "engine")
    resolved = resolve(settings, XEON, on_cuda=False, environ={})
    chosen = resolved.settings
    assert (chosen.dtype, chosen.torch_threads, chosen.quantization) == ("float32", 16, "none")
    assert chosen.compute_wide_rows == WIDE_ROWS
    assert chosen.speculative_max_batch == values(XEON)["speculative_max_batch"]
    assert resolved.core_env == {"GOMP_SPINCOUNT": "10000"}
    assert resolved.choices["dtype"].source == "auto"


def test_explicit_flags_and_openmp_environment_win():
    flags = ["--dtype", "float32", "--torch-threads", "3", "--quantization", "int8"]
    flags += ["--compute-wide-rows", "1", "--wide-gemm", "float32", "--kv-cache-dtype", "bf16"]
    flags += ["--kernel-weights", "float32", "--kernel-activations", "float32"]
    settings = parse_settings(EngineSettings, [*flags, "--speculative-max-batch", "2"], "engine")
    resolved = resolve(settings, XEON, on_cuda=False, environ={"GOMP_SPINCOUNT": "1000"})
    chosen = resolved.settings
    assert (chosen.dtype, chosen.torch_threads, chosen.quantization) == ("float32", 3, "int8")
    assert (chosen.speculative_max_batch, chosen.compute_wide_rows) == (2, 1)
    # The core inherits the environment's OpenMP variables; none are added.
    assert resolved.core_env == {}
    assert {c.source for c in resolved.choices.values()} == {"flag", "env"}


def test_a_benchmark_in_process_takes_the_cores_openmp_unless_it_was_given():
    environ = {}
    use_core_omp(environ)
    assert (
        environ == resolve(parse_settings(EngineSettings, [], "engine"), EPYC, False, {}).core_env
    )
    given = {"OMP_WAIT_POLICY": "PASSIVE"}
    use_core_omp(given)
    assert given == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_an_explicit_none_quantization_is_given_not_chosen():
    settings = parse_settings(EngineSettings, ["--quantization", "none"], "engine")
    assert resolve(settings, EPYC, False, {}).choices["quantization"].source == "flag"


def test_the_launcher_logs_one_line_with_every_choice_and_why(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with capture_logs() as logs:
        resolved = resolve_for_core(parse_settings(EngineSettings, ["--device", "cpu"], "engine"))
    (line,) = [entry for entry in logs if entry["event"] == "engine_machine_defaults"]
    assert line["cpu_model"] and isinstance(line["cpu_flags"], list)
    names = ("dtype", "torch_threads", "compute_wide_rows", "omp", "quantization")
    for name in (*names, "speculative_max_batch"):
        assert line[f"{name}_why"].startswith("auto: ")
    assert (line["dtype"], line["torch_threads"]) == (
        resolved.settings.dtype,
        resolved.settings.torch_threads,
    )
    assert resolved.core_env == line["omp"]


def test_a_negative_speculative_batch_is_refused():
    with pytest.raises(ValueError):
        parse_settings(EngineSettings, ["--speculative-max-batch", "-1"], "engine")


def test_maas_up_shows_the_engines_choices_from_its_log(tmp_path):
    resolved = resolve(parse_settings(EngineSettings, [], "engine"), EPYC, False, {})
    entry = {"event": "engine_machine_defaults", **resolved.log_fields(EPYC)}
    log = tmp_path / "engine-0.log"
    log.write_text('{"event": "engine_starting"}\n' + json.dumps(entry) + "\n")
    shown = machine_defaults(log)
    assert shown.startswith("engine on AMD EPYC (avx avx2 f16c fma): float32, compute threads 2, ")
    assert "GOMP_SPINCOUNT=10000" in shown and "batch 4" in shown
    assert machine_defaults(tmp_path / "missing.log") == ""
    # A crowded machine's choice: narrow steps one core fewer.
    flags = ["--compute-wide-rows", "32"]
    crowded = resolve(parse_settings(EngineSettings, flags, "engine"), EPYC, False, {})
    log.write_text(json.dumps({"event": "engine_machine_defaults", **crowded.log_fields(EPYC)}))
    assert "compute threads 2 from 32 rows a step, 1 below," in machine_defaults(log)
    # Where the matmuls and the KV cache are bf16 (the avx512_bf16 class), it says so.
    zen5 = resolve(parse_settings(EngineSettings, [], "engine"), ZEN5, False, {})
    log.write_text(json.dumps({"event": "engine_machine_defaults", **zen5.log_fields(ZEN5)}))
    assert "): float32 (bf16 matmuls and KV cache), compute threads" in machine_defaults(log)
    # The opt-in int8 activations, too.
    int8 = resolve(
        parse_settings(EngineSettings, ["--wide-gemm", "int8"], "engine"), ZEN5, False, {}
    )
    log.write_text(json.dumps({"event": "engine_machine_defaults", **int8.log_fields(ZEN5)}))
    shown = machine_defaults(log)
    assert "float32 (bf16 KV cache, int8 activations on the checkpoint's blocks)" in shown
