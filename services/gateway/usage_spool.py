"""A durable local spool for usage events while Redis is unreachable.

Every event is a JSON line, fsynced before emit() returns, so a gateway crash
after a request finished cannot lose its bill. A replay task sends the spool
to the stream in file order once Redis answers, then rewrites the file
without what was sent (temp file + rename, atomic). While anything is
spooled, new events are appended behind it rather than sent directly, so the
stream sees events in the order they happened. A crash between the XADD and
the rewrite can resend a line: billing is idempotent by request id, so that
is a duplicate delivery, never a double charge.
"""

import asyncio
import os
from pathlib import Path

from services.common.usage_event import UsageEvent


class UsageSpool:
    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "usage.jsonl"
        self.lock = asyncio.Lock()

    def __len__(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as spool:
            return sum(1 for line in spool if line.strip())

    def has_events(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    async def append(self, event: UsageEvent) -> None:
        await asyncio.to_thread(self._append, event.model_dump_json() + "\n")

    def _append(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as spool:
            spool.write(line)
            spool.flush()
            os.fsync(spool.fileno())

    def read(self) -> list[UsageEvent]:
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [UsageEvent.model_validate_json(line) for line in lines if line.strip()]

    def drop_first(self, count: int) -> None:
        """Remove the first `count` events, atomically."""
        lines = [x for x in self.path.read_text(encoding="utf-8").splitlines() if x.strip()]
        temp = self.path.with_suffix(".tmp")
        with temp.open("w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lines[count:])
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, self.path)
