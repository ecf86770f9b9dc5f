"""An image without a compiler serves with the library its build stage prebuilt."""

from pathlib import Path

import pytest
import torch

from services.engine.native import library as native

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
