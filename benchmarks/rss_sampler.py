"""Resident memory of the stack's services, sampled every 100 ms in a thread.

A process's VmHWM is its peak since it started, and cannot be reset from
outside, so one attack's peak would hide the next one's: a sampler thread
reads VmRSS instead and keeps a peak per window (reset() starts one). A
service is its process and every descendant (the engine's core process, a
compile worker), summed, since a child's memory is the service's too.
"""

import threading
from pathlib import Path

KIB_PER_MB = 1024


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        children += [int(child) for child in task.read_text().split()]
    return children


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tree_rss_mb(pid: int) -> float:
    """VmRSS of pid and all its descendants, in MB; 0 once the process is gone."""
    total, pending, seen = 0, [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            total += _rss_kib(current)
            pending += _children(current)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # exited between two reads
    return total / KIB_PER_MB


class RssSampler(threading.Thread):
    """Samples each named process tree until stop(); peaks() since the last reset()."""

    def __init__(self, pids: dict[str, int], interval: float = 0.1):
        super().__init__(name="rss-sampler", daemon=True)
        self._pids = pids
        self._interval = interval
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._current = {name: tree_rss_mb(pid) for name, pid in pids.items()}
        self._peak = dict(self._current)

    def run(self) -> None:
        while not self._stopped.wait(self._interval):
            sample = {name: tree_rss_mb(pid) for name, pid in self._pids.items()}
            with self._lock:
                self._current = sample
                self._peak = {name: max(self._peak[name], rss) for name, rss in sample.items()}

    def reset(self) -> dict[str, float]:
        """Start a new window at the current readings, and return them."""
        with self._lock:
            self._peak = dict(self._current)
            return _rounded(self._current)

    def current(self) -> dict[str, float]:
        with self._lock:
            return _rounded(self._current)

    def peaks(self) -> dict[str, float]:
        with self._lock:
            return _rounded(self._peak)

    def stop(self) -> None:
        self._stopped.set()
        self.join(5)


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {name: round(value, 1) for name, value in values.items()}
