"""A redis-server of a test's own, configured with extra arguments and stopped at will.

The session's shared Redis must stay healthy for every other test; a test
that fills Redis, makes it a read-only replica or takes it down uses one of
these instead.
"""

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process


@contextlib.asynccontextmanager
async def private_redis(state_dir: Path, *extra: str) -> AsyncIterator[tuple[str, ManagedProcess]]:
    """(url, process); later arguments override the local stack's own."""
    port = free_port()
    process = redis_process(state_dir, port)
    process.argv += list(extra)
    process.start()
    url = f"redis://127.0.0.1:{port}/0"
    try:
        await wait_ready(process, url, timeout=30)
        yield url, process
    finally:
        process.stop(timeout=10)
