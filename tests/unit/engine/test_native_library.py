"""The library's builds: an image without a compiler serves with the one its build stage
prebuilt; a CPU's own build computes the portable one's bits."""

import ctypes
from pathlib import Path

import pytest
import torch

from maas_kernels.native import bindings
from maas_kernels.native import library as native
from maas_kernels.quant_int4_ref import quantize_int4
from maas_kernels.quant_int8_ref import quantize_int8
from maas_services.common.machine_profile import machine_profile
from maas_services.engine import cpu_linear
from maas_services.engine.quantization import cpu_kernel

needs_avx2 = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
    reason="the native kernels need AVX2",
)


@needs_avx2
def test_a_prebuilt_library_is_loaded_where_nothing_could_build_one(monkeypatch, tmp_path):
    prebuilt = tmp_path / "package"
    prebuilt.mkdir()
    monkeypatch.setattr(native, "PREBUILT", prebuilt)
    built = native.prebuild()  # the Dockerfile's build stage, which has a compiler
    assert built.parent == prebuilt and built.is_file()
    # The runtime stage: no compiler, an empty cache.
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MAAS_CACHE_DIR", str(tmp_path / "cache"))
    native.library.cache_clear()
    try:
        lib = native.library()
        assert lib is not None and Path(lib._name) == built
        assert not (tmp_path / "cache").exists()  # nothing was built or written
    finally:
        native.library.cache_clear()


def test_without_a_prebuilt_library_or_a_compiler_there_is_none(without_a_compiler):
    assert native.library() is None


@pytest.fixture(scope="module")
def portable(tmp_path_factory):
    """The portable AVX2 build beside this CPU's own, with every caller's signatures."""
    if native.build_flags(machine_profile().flags) == native.FLAGS:
        pytest.skip("this CPU's library is the portable build")
    path = tmp_path_factory.mktemp("portable") / native._name()
    native.build(path, native.find_compiler())
    return bindings.bind(ctypes.CDLL(str(path)))


@needs_avx2
@pytest.mark.parametrize("rows", [10, 40, 64])  # the dot form; outer tiles of 16 and of 8
def test_this_cpus_build_gives_the_portable_builds_bits(portable, monkeypatch, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=g)
    weight = torch.randn(3072, 576, generator=g)  # a wide one: cpu_linear's panel GEMM
    q8 = quantize_int8(weight[:1000])
    q4 = quantize_int4(weight[:1000], 64)

    def outputs():
        return (
            cpu_linear.linear(x, weight),
            cpu_kernel.int8_matmul(x, *q8),
            cpu_kernel.int4_matmul(x, *q4, 64),
        )

    own = outputs()
    assert Path(native.library()._name).name != Path(portable._name).name
    monkeypatch.setattr(bindings, "library", lambda: portable)
    for mine, theirs in zip(own, outputs(), strict=True):
        assert torch.equal(mine, theirs)
