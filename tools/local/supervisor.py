"""Keeping `maas up`'s children running, as a kubelet keeps a pod's containers.

A child that exits is started again on its own, after a delay that doubles with
each restart (as CrashLoopBackOff does), while the others keep serving: a dead
billing delays bills, it does not cut open streams. The delay starts over once
a child has run for `stable_after` seconds. Every exit and restart is logged,
and the counts go to the state file, where `maas top` shows them.

Only a child that keeps dying at start ends the stack: one that exits (or never
becomes ready) `max_start_failures` times in a row after a restart has a cause
a restart cannot fix (a port taken, a broken file), and locally nobody watches
a pod list, so the stack stops with the child's name and its last log lines.
"""

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from maas_services.common.logging import get_logger
from maas_tools.local.processes import ManagedProcess
from maas_tools.local.readiness import StartupError, wait_ready

log = get_logger(__name__)


@dataclass
class RestartPolicy:
    initial_backoff: float = 1.0
    max_backoff: float = 30.0
    stable_after: float = 60.0
    max_start_failures: int = 5


class CrashLoop(RuntimeError):
    """A child died at start too many times in a row: the stack gives up."""


class Backoff:
    """The delay before the next restart: doubling, up to the policy's cap."""

    def __init__(self, policy: RestartPolicy):
        self._policy = policy
        self.delay = policy.initial_backoff

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self._policy.max_backoff)
        return delay

    def reset(self) -> None:
        self.delay = self._policy.initial_backoff


@dataclass
class _Child:
    process: ManagedProcess
    policy: RestartPolicy
    # Seconds a restarted child has to become ready before the try counts as failed.
    startup_timeout: float
    on_restart: Callable[[], None]


async def _restart_until_ready(child: _Child, backoff: Backoff) -> None:
    process, policy = child.process, child.policy
    for failures in range(1, policy.max_start_failures + 1):
        await asyncio.sleep(backoff.next())
        process.start()
        process.restarts += 1
        child.on_restart()
        try:
            await wait_ready(process, process.restart_probe or process.probe, child.startup_timeout)
            log.warning("child_restarted", child=process.name, restarts=process.restarts)
            return
        except StartupError as exc:
            # Not ready in time but still running: it must go before the next try.
            process.stop(timeout=0)
            error = exc
            log.warning("child_start_failed", child=process.name, failures=failures, error=str(exc))
    raise CrashLoop(
        f"{process.name} keeps dying at start ({policy.max_start_failures} restarts in a row "
        f"failed); giving up. Last failure: {error}"
    )


async def _keep_running(child: _Child) -> None:
    process, backoff = child.process, Backoff(child.policy)
    while True:
        code = await process.wait_exit()
        if time.monotonic() - process.started_at >= child.policy.stable_after:
            backoff.reset()
        log.error(
            "child_exited",
            child=process.name,
            exit_code=code,
            restarts=process.restarts,
            restart_in=backoff.delay,
            log_file=str(process.log_path),
        )
        await _restart_until_ready(child, backoff)


async def supervise(
    processes: Iterable[ManagedProcess],
    policy: RestartPolicy,
    startup_timeout: float,
    on_restart: Callable[[], None] = lambda: None,
) -> None:
    """Restart each child that exits, until one crash-loops (raises CrashLoop).

    Runs until cancelled; cancel it before stopping the children, or it will
    start them again. `on_restart` is called after each restart.
    """
    tasks = [
        asyncio.create_task(
            _keep_running(_Child(p, policy, startup_timeout, on_restart)),
            name=f"supervise {p.name}",
        )
        for p in processes
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
