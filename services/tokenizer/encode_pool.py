"""Rendering and encoding on a bounded pool of threads, off the event loop.

Encoding a prompt of megabytes takes CPU-seconds; on the event loop it would
stall every other call, health checks included. The Rust encoder releases the
GIL (TextTokenizer encodes through it), so jobs on `threads` threads run while
the loop keeps serving. At most `queue` more jobs wait for a thread: beyond
that a call is refused at once (PoolFullError, RESOURCE_EXHAUSTED to the
caller) rather than holding its text in memory behind an unbounded queue.
"""

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from prometheus_client import Gauge

T = TypeVar("T")

PENDING = Gauge("maas_tokenizer_pool_jobs", "Render and encode jobs running or waiting")


class PoolFullError(Exception):
    pass


class EncodePool:
    def __init__(self, threads: int, queue: int):
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="encode")
        self._capacity = threads + queue
        self._lock = threading.Lock()
        # Jobs the executor holds, running or queued: released when a job ends
        # or is cancelled unstarted, not when its caller stops waiting.
        self._pending = 0

    async def run(self, fn: Callable[..., T], *args) -> T:
        with self._lock:
            if self._pending >= self._capacity:
                raise PoolFullError(
                    f"the tokenizer is busy ({self._pending} requests in progress); retry shortly"
                )
            self._pending += 1
            PENDING.inc()
        future = self._executor.submit(fn, *args)
        future.add_done_callback(self._release)
        return await asyncio.wrap_future(future)

    def _release(self, _: Future) -> None:
        with self._lock:
            self._pending -= 1
            PENDING.dec()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
