"""The supervisor on small real processes: restart the one that died, spare the
others, give up on one that dies at start every time."""

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess
from maas_tools.local.supervisor import Backoff, CrashLoop, RestartPolicy, supervise
from tests.integration.router.conftest import eventually

FAST = RestartPolicy(initial_backoff=0.05, max_backoff=0.2, max_start_failures=3)


def events(logs: list[dict], name: str) -> int:
    return sum(entry["event"] == name for entry in logs)


def web_server(name: str, logs: Path) -> ManagedProcess:
    """A child with a readiness probe: Python's own HTTP server on a free port."""
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    return ManagedProcess(name, argv, logs / f"{name}.log", probe=f"http://127.0.0.1:{port}/")


async def test_a_killed_child_is_restarted_and_its_sibling_keeps_running(tmp_path):
    victim, sibling = web_server("victim", tmp_path), web_server("sibling", tmp_path)
    for child in (victim, sibling):
        child.start()
    restarts = []
    supervising = asyncio.create_task(
        supervise([victim, sibling], FAST, 30, lambda: restarts.append(victim.restarts))
    )
    try:
        first_pid, sibling_pid = victim.pid, sibling.pid
        os.kill(first_pid, signal.SIGKILL)
        await eventually(lambda: victim.restarts == 1, timeout=30, what="a restart")
        await eventually(lambda: victim.pid != first_pid and victim.exited() is None, timeout=30)
        assert (sibling.pid, sibling.exited(), sibling.restarts) == (sibling_pid, None, 0)
        assert restarts == [1]
        assert not supervising.done()
    finally:
        supervising.cancel()
        for child in (victim, sibling):
            child.stop(5)


async def test_a_child_that_keeps_dying_at_start_ends_supervision_with_its_log(tmp_path):
    sibling = web_server("sibling", tmp_path)
    broken = ManagedProcess(
        "broken",
        [sys.executable, "-c", "import sys; sys.exit('cannot open model.gguf: corrupt header')"],
        tmp_path / "broken.log",
        probe=f"http://127.0.0.1:{free_port()}/",  # nobody listens there
    )
    for child in (sibling, broken):
        child.start()
    try:
        with pytest.raises(CrashLoop) as error:
            await supervise([sibling, broken], FAST, 30)
        assert broken.restarts == FAST.max_start_failures
        message = str(error.value)
        assert message.startswith("broken keeps dying at start (3 restarts in a row failed)")
        assert "cannot open model.gguf: corrupt header" in message
        assert sibling.exited() is None and sibling.restarts == 0
    finally:
        sibling.stop(5)


def test_backoff_doubles_up_to_its_cap_and_starts_over_on_reset():
    backoff = Backoff(RestartPolicy(initial_backoff=1, max_backoff=5))
    assert [backoff.next() for _ in range(5)] == [1, 2, 4, 5, 5]
    backoff.reset()
    assert backoff.next() == 1


@pytest.mark.parametrize(("stable_after", "delays"), [(3600, [0.05, 0.1, 0.2]), (0, [0.05] * 3)])
async def test_the_delay_doubles_per_death_unless_the_child_ran_stably(
    tmp_path, stable_after, delays
):
    victim = web_server("victim", tmp_path)
    victim.start()
    policy = RestartPolicy(initial_backoff=0.05, max_backoff=1, stable_after=stable_after)
    supervising = asyncio.create_task(supervise([victim], policy, 30))
    try:
        with capture_logs() as logs:
            for restarts in range(1, 4):
                os.kill(victim.pid, signal.SIGKILL)
                # Ready again before the next kill, so each death is an exit, not a failed start.
                await eventually(
                    lambda n=restarts: events(logs, "child_restarted") == n, timeout=30
                )
        exits = [entry for entry in logs if entry["event"] == "child_exited"]
        assert [e["restart_in"] for e in exits] == delays
    finally:
        supervising.cancel()
        victim.stop(5)
