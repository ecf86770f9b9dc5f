"""`maas up` as a user runs it: ready line, a real answer, and no orphans on exit."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.ports import free_port

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent's wait is missing.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def start_up(state_dir: Path, port: int) -> tuple[subprocess.Popen, dict]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "maas_tools.cli",
            "up",
            "--port",
            str(port),
            "--state-dir",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = []
    deadline = time.monotonic() + 300
    for line in process.stdout:
        output.append(line)
        if "maas is ready at" in line:
            break
        assert time.monotonic() < deadline, "".join(output)
    else:
        pytest.fail("maas up exited before ready:\n" + "".join(output))
    return process, json.loads((state_dir / "stack.json").read_text())


def wait_gone(pids: list[int], timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGKILL])
def test_up_serves_then_leaves_no_orphans(tmp_path, stop_signal):
    port = free_port()
    process, state = start_up(tmp_path, port)
    try:
        key = (tmp_path / "dev-api-key").read_text().strip()
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": DEFAULT_MODEL_ID,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}],
            },
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        children = list(state["pids"].values())
        assert len(children) == 6  # redis, tokenizer, engine, billing, router, gateway
        process.send_signal(stop_signal)
        assert process.wait(timeout=60) in (0, -signal.SIGKILL)
        # SIGKILL gives maas up no chance to clean up: the kernel's parent-death
        # signal must still stop every child.
        assert wait_gone(children) == []
    finally:
        if process.poll() is None:
            process.kill()
