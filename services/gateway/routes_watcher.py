"""Keeps the routing table in step with its file, without a restart.

The file is polled rather than watched with inotify: Kubernetes updates a
mounted ConfigMap by swapping a symlink, which inotify on the file misses,
and reading a small file once a second costs nothing. A file that fails to
parse keeps the previous table (logged, counted); a missing file means the
empty table, which serves every deployment under its own name.
"""

import asyncio
import contextlib
import hashlib
from pathlib import Path

from prometheus_client import Counter
from pydantic import ValidationError
from yaml import YAMLError

from services.common.logging import get_logger
from services.gateway.routing_table import RoutingTable

log = get_logger(__name__)

RELOADS = Counter("maas_gateway_routes_reloads", "Routing table loads", ["outcome"])


class RoutesWatcher:
    def __init__(self, path: str, interval: float = 1.0):
        self._path = Path(path) if path else None
        self._interval = interval
        self._digest: str | None = None
        self.table = RoutingTable()
        self._task: asyncio.Task | None = None
        self.reload()

    def reload(self) -> bool:
        """Load the file if it changed; True when a new table took effect."""
        try:
            data = self._path.read_bytes() if self._path else b""
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            log.error("routes_unreadable", path=str(self._path), error=str(exc))
            RELOADS.labels("error").inc()
            return False
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            self.table = RoutingTable.from_yaml(data.decode())
        except (YAMLError, ValidationError, UnicodeDecodeError) as exc:
            log.error("routes_invalid_kept_previous", path=str(self._path), error=str(exc))
            RELOADS.labels("error").inc()
            return False
        log.info("routes_loaded", path=str(self._path), aliases=sorted(self.table.models))
        RELOADS.labels("loaded").inc()
        return True

    def start(self) -> None:
        if self._path is not None:
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.reload()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
