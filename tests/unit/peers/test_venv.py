"""A peer venv is built once, atomically, with progress, and named interpreters win."""

import json
import subprocess
import sys

import pytest

from maas_tools.peers import venv
from maas_tools.peers.venv import Peer, ensure, installed, llama_cmake_args, venv_dir

# Small wheels pip already has; idna stands in for vLLM's broken torchvision.
DEMO = Peer(
    name="demo",
    version="1",
    packages=("iniconfig==2.3.1", "idna==3.20"),
    module="iniconfig",
    python_env="MAAS_DEMO_PYTHON",
    remove=("idna",),
)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MAAS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(DEMO.python_env, raising=False)
    return tmp_path


def test_builds_once_with_progress_and_removes_what_breaks(cache_dir):
    lines: list[str] = []
    python = ensure(DEMO, lines.append)
    assert python == venv_dir(DEMO) / "bin" / "python"
    assert any("building the demo 1 venv" in line for line in lines)
    assert any("iniconfig" in line for line in lines)  # pip's own lines, not silence
    subprocess.run([python, "-c", "import iniconfig"], check=True)
    removed = subprocess.run([python, "-c", "import idna"], capture_output=True)
    assert removed.returncode != 0
    marker = json.loads((venv_dir(DEMO) / venv.MARKER).read_text())
    assert marker["packages"] == list(DEMO.packages)
    # Only the finished venv and the lock are left beside it.
    assert sorted(p.name for p in (cache_dir / "peers").iterdir()) == [".demo.lock", "demo-1"]

    again: list[str] = []
    assert ensure(DEMO, again.append) == python
    assert again == []
    # Another spec under the same name and version (new build flags) is not this venv.
    assert installed(Peer(**{**DEMO.__dict__, "build_env": {"CMAKE_ARGS": "-DX=ON"}})) is None


def test_failed_build_publishes_nothing(cache_dir):
    broken = Peer(**{**DEMO.__dict__, "remove": (), "module": "no_such_module_in_this_venv"})
    with pytest.raises(RuntimeError, match="no_such_module_in_this_venv"):
        ensure(broken, lambda line: None)
    assert installed(broken) is None
    assert [p.name for p in (cache_dir / "peers").iterdir()] == [".demo.lock"]


def test_named_interpreter_is_used_as_is(monkeypatch, tmp_path):
    monkeypatch.setenv(DEMO.python_env, sys.executable)
    assert ensure(DEMO, lambda line: pytest.fail(line)) == venv.Path(sys.executable)
    monkeypatch.setenv(DEMO.python_env, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="MAAS_DEMO_PYTHON"):
        installed(DEMO)


def test_llama_build_flags_follow_the_cpu():
    assert llama_cmake_args(frozenset({"avx2", "fma", "f16c"})) == "-DGGML_NATIVE=ON"
    amx = frozenset({"avx2", "avx512f", "amx_tile", "amx_bf16"})
    assert llama_cmake_args(amx) == "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
    assert venv.llama_peer(amx).build_env == {"CMAKE_ARGS": "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"}
