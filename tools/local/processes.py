"""Child processes of `maas up`: started with logs to files, never orphaned.

Each child runs under maas_tools.local.guard, which asks the kernel for SIGTERM
when its parent dies (PR_SET_PDEATHSIG), so even a `kill -9` of `maas up`
leaves nothing running.

A child can be started again (maas_tools.local.supervisor restarts one that
died): the same command line, ports and log file, which it appends to.
"""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# How often a supervised child is checked for exit: a restart waits on
# backoff anyway, so a tenth of its shortest delay is plenty.
EXIT_POLL_SECONDS = 0.1


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    # What says the child is ready (see maas_tools.local.readiness.wait_ready).
    probe: str = ""
    # What says a restarted child started, if not `probe`: billing's liveness, which
    # holds while Redis is down, where readiness would count a Redis outage as a
    # failed start and end the stack (kubelet's startup probe, for the same reason).
    restart_probe: str = ""
    # Stop the child's whole process group: for children that start processes of
    # their own which outlive them (vLLM's engine core holds the port and the KV
    # memory), including ones left by a child that died.
    stop_group: bool = False
    process: subprocess.Popen | None = None
    started_at: float = 0.0  # time.monotonic() of the latest start
    restarts: int = 0

    def start(self) -> None:
        if self.stop_group and self.process is not None:
            self._signal_group(signal.SIGKILL)
        self.started_at = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "maas_tools.local.guard", str(os.getpid()), *self.argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                # Ctrl-C goes to the terminal's process group; children get
                # their stop signal from us instead, in order.
                process_group=0,
            )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    async def wait_exit(self) -> int:
        """The exit code, once the child has exited (without blocking the event loop)."""
        while (code := self.exited()) is None:
            await asyncio.sleep(EXIT_POLL_SECONDS)
        return code

    def stop(self, timeout: float) -> None:
        if self.process is None:
            return
        if self.process.poll() is not None:
            if self.stop_group:
                self._signal_group(signal.SIGKILL)
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        if self.stop_group:
            self._signal_group(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.stop_group:
            self._signal_group(sig)
        else:
            self.process.send_signal(sig)

    def _signal_group(self, sig: int) -> None:
        # The child leads its group (process_group=0), so its pid names the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def serve_argv(service: str, flags: dict[str, object], extra: list[str] | None = None) -> list[str]:
    """The command line of `maas serve SERVICE --flag value ...` in this interpreter."""
    argv = [sys.executable, "-m", "maas_tools.cli", "serve", service]
    for name, value in flags.items():
        if isinstance(value, list):
            for item in value:
                argv += [f"--{name}", str(item)]
        else:
            argv += [f"--{name}", str(value)]
    return argv + (extra or [])
