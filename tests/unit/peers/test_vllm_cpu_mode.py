"""vLLM's dtype and eager/compiled per CPU class: never eager bf16 where AMX may be (#32)."""

from pathlib import Path

import pytest

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_services.common.vllm_cpu_mode import vllm_cpu_mode
from maas_tools.peers.vllm_server import VllmConfig

# lscpu's flags, abridged to what decides: an AMX Xeon (family 6 model 207), a
# Zen 5 (AVX512-BF16, no AMX), and this machine's Zen 3 (AVX2 only).
AMX_XEON = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"})
ZEN5 = frozenset({"avx2", "avx512f", "avx512_bf16"})
ZEN3 = frozenset({"avx2", "fma"})


def test_amx_never_runs_eager_bf16_and_compiles_by_default():
    mode = vllm_cpu_mode(AMX_XEON)
    assert (mode.dtype, mode.enforce_eager) == ("bfloat16", False)
    assert "eager bf16 is wrong on an AMX CPU" in mode.reason
    # bf16 asked for, eager asked for: bf16 wins, compiled.
    assert not vllm_cpu_mode(AMX_XEON, "bfloat16", enforce_eager=True).enforce_eager


def test_amx_with_eager_asked_and_no_dtype_runs_eager_float32():
    # The tests' cheap start: no compile, in the dtype that is right there.
    mode = vllm_cpu_mode(AMX_XEON, "auto", enforce_eager=True)
    assert (mode.dtype, mode.enforce_eager) == ("float32", True)
    assert vllm_cpu_mode(AMX_XEON, "float32", enforce_eager=True).enforce_eager


@pytest.mark.parametrize(("flags", "dtype"), [(ZEN5, "bfloat16"), (ZEN3, "float32")])
def test_without_amx_eager_is_right_and_the_default(flags, dtype):
    mode = vllm_cpu_mode(flags)
    assert (mode.dtype, mode.enforce_eager) == (dtype, True)
    assert vllm_cpu_mode(flags, "bfloat16", enforce_eager=True).enforce_eager
    assert not vllm_cpu_mode(flags, enforce_eager=False).enforce_eager


def test_an_unknown_cpu_is_read_as_one_that_may_have_amx():
    compiled = vllm_cpu_mode(None, "auto", enforce_eager=False)
    assert (compiled.dtype, compiled.enforce_eager) == ("auto", False)
    cheap = vllm_cpu_mode(None, "auto", enforce_eager=True)
    assert (cheap.dtype, cheap.enforce_eager) == ("float32", True)
    assert "may have AMX" in cheap.reason
    assert not vllm_cpu_mode(None, "bfloat16", enforce_eager=True).enforce_eager
    assert vllm_cpu_mode(None, "float32", enforce_eager=True).enforce_eager


@pytest.mark.parametrize(
    ("flags", "eager", "dtype"), [(AMX_XEON, False, "bfloat16"), (ZEN3, True, "float32")]
)
def test_the_server_command_line_follows_the_cpu(flags, eager, dtype):
    config = VllmConfig(python=Path("python"), model=Path("m"), cpu_flags=flags)
    argv = config.argv()
    assert ("--enforce-eager" in argv) is eager
    assert argv[argv.index("--dtype") + 1] == dtype
    assert config.mode_reason


def cpu_vllm_args(**engine) -> list[str]:
    spec = {
        "model": {"name": "smol", "source": {"uri": "pvc://models/smol"}},
        "engine": {"backend": "vllm", "kvCacheMemory": "1Gi", **engine},
    }
    pod = resources.deployment(
        {"metadata": {"name": "smol", "namespace": "ns", "uid": "u"}},
        defaulted_spec(spec),
        "maas:1",
        1,
    )["spec"]["template"]["spec"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    return vllm["args"]


def test_the_operators_cpu_pod_never_runs_eager_bf16():
    # enforceEager asks for a cheap start: on a node that may have AMX, float32 eager.
    args = cpu_vllm_args(enforceEager=True)
    assert "--enforce-eager" in args and "--dtype=float32" in args
    args = cpu_vllm_args(enforceEager=True, dtype="bfloat16")
    assert "--enforce-eager" not in args and "--dtype=bfloat16" in args
    assert "--enforce-eager" not in cpu_vllm_args()
