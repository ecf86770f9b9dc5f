"""A child that starts processes of its own (vLLM's engine core) is stopped with them."""

import os
import sys
import time

from maas_tools.local.processes import ManagedProcess

# Prints its own child's pid, then waits: the shape of vLLM's API server.
PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def _grandchild(process: ManagedProcess) -> int:
    for _ in range(600):
        text = process.log_path.read_text() if process.log_path.exists() else ""
        if text.strip():
            return int(text.split()[0])
        time.sleep(0.05)
    raise AssertionError(f"no pid in {process.log_path}")


def _gone(pid: int) -> bool:
    # Waits for the kernel to reap it: the grandchild is re-parented once its parent dies.
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_stop_ends_the_whole_group(tmp_path):
    process = ManagedProcess(
        "parent", [sys.executable, "-c", PARENT], tmp_path / "p.log", stop_group=True
    )
    process.start()
    grandchild = _grandchild(process)
    process.stop(timeout=10)
    assert _gone(grandchild)


def test_restart_ends_what_a_dead_child_left(tmp_path):
    process = ManagedProcess(
        "parent", [sys.executable, "-c", PARENT], tmp_path / "p.log", stop_group=True
    )
    process.start()
    orphan = _grandchild(process)
    process.process.kill()  # the leader dies; its child keeps running, as vLLM's core would
    process.process.wait()
    process.log_path.unlink()
    process.start()
    assert _gone(orphan)
    process.stop(timeout=10)
