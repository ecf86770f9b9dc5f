"""Which CPUs get the bf16 panel GEMM (library.py's build flags, machine_defaults' table),
and that the AMX build compiles on any machine with a compiler (it runs only on AMX CPUs:
test_bf16_panel.py)."""

import ctypes

import pytest

from maas_kernels.native import bindings
from maas_kernels.native import library as native
from maas_services.common.machine_profile import MachineProfile, machine_profile
from maas_services.engine.machine_defaults import WIDE_GEMM_BY_CPU_CLASS, cpu_class, derive

AVX2 = frozenset({"fma", "avx", "avx2", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl"}
ZEN4 = AVX512 | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8"}


def test_bf16_and_amx_flags_are_added_only_for_cpus_that_have_them():
    assert native.build_flags(AVX2) == native.FLAGS
    assert native.build_flags(AVX512) == (*native.FLAGS, "-mavx512f")
    assert native.build_flags(ZEN4)[-2:] == ("-mavx512bf16", "-mavx512vl")
    assert native.build_flags(SAPPHIRE_RAPIDS)[-2:] == ("-mamx-tile", "-mamx-bf16")
    # AMX without AVX-512's bf16 (no such CPU) would get no tiles: each level needs the last.
    assert "-mamx-tile" not in native.build_flags(AVX512 | {"amx_tile", "amx_bf16"})
    # VNNI's int16 and int8 dot products on top of whichever level a CPU reached.
    vnni = ("-mavx512vl", "-mavx512bw", "-mavx512vnni")
    assert native.build_flags(ZEN4 | {"avx512_vnni"}) == (*native.build_flags(ZEN4), *vnni)
    assert native.build_flags(AVX512 | {"avx512_vnni"})[-3:] == vnni
    assert "-mavx512vnni" not in native.build_flags(AVX2 | {"avx512_vnni"})
    names = {native._name(native.build_flags(f)) for f in (AVX2, AVX512, ZEN4, SAPPHIRE_RAPIDS)}
    assert len(names) == 4


def machine(flags: frozenset[str]) -> MachineProfile:
    return MachineProfile("a CPU", flags, cpus=2, physical_cores=2)


def test_auto_takes_the_measured_wide_gemm_of_each_cpu_class():
    for flags in (AVX2, AVX512, ZEN4, SAPPHIRE_RAPIDS):
        chosen = derive(machine(flags), False, draft_tokens=4, max_num_seqs=64)["wide_gemm"]
        row = WIDE_GEMM_BY_CPU_CLASS[cpu_class(machine(flags))]
        kind = cpu_class(machine(flags))
        assert (chosen.value, chosen.why) == (row.value, f"{kind} CPU, measured: {row.measured}")
    assert derive(machine(AVX2), False, 4, 64)["wide_gemm"].value == "float32"
    # CUDA runs no native layers at all.
    assert derive(machine(ZEN4), True, 4, 64)["wide_gemm"].value == "float32"


@pytest.mark.skipif(native.find_compiler() is None, reason="no C++ compiler")
def test_the_amx_build_compiles_and_says_what_it_has(tmp_path):
    """The AMX sources compile here whatever the CPU (g++ needs no AMX to emit them). On a
    CPU with AVX512-BF16 the library also loads and binds, so its layout and exports are
    checked, and says which panel it would run: AMX tiles only where Linux grants them, so
    only on an AMX CPU (elsewhere its AVX-512 code must not run at all)."""
    path = tmp_path / native._name(native.build_flags(SAPPHIRE_RAPIDS))
    native.build(path, native.find_compiler(), native.build_flags(SAPPHIRE_RAPIDS))
    if not machine_profile().flags >= ZEN4:
        return
    lib = bindings.bind(ctypes.CDLL(str(path)))
    # Asking for the tile state is a syscall: harmless on a CPU without AMX (refused there).
    assert bindings.WIDE_BF16_KERNELS[lib.wide_bf16_kernel()] in ("avx512_bf16", "amx")
