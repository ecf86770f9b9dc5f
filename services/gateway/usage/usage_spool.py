"""A durable local spool for usage events while Redis is unreachable.

Every event is a JSON line appended to `usage.jsonl`, fsynced before emit()
returns, so a gateway crash after a request finished cannot lose its bill.
The file is only ever appended to; replay reads it forward from a committed
byte offset (`usage.offset`, replaced atomically), so each byte is read once
however long the outage was, and the file is truncated once replay reaches
its end. A crash between the XADD and the offset commit can resend a line:
billing is idempotent by request id, so that is a duplicate delivery, never a
double charge.

A line that does not parse (a write torn by ENOSPC or a crash) is moved to
`quarantine.jsonl` for a person to read, counted, and skipped: one bad line
must not stop the bills behind it. A failed append is cut back off the file,
and a torn tail found at open is closed with a newline, so a later event is
never glued onto a fragment.

Ownership. A spool directory belongs to the process holding an exclusive
flock on its `lock` file. The kernel drops the lock when that process dies
(on NFSv4 the server's lock lease expires), so another replica sharing the
parent directory can claim a dead replica's spool with a non-blocking flock
and replay it: a spool left by a pod that was scaled away is never stranded.
"""

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter
from pydantic import ValidationError

from maas_services.common.logging import get_logger
from maas_services.common.usage_event import UsageEvent

log = get_logger(__name__)

# Longer than a claimer's replay of a spool left by a dead replica.
OPEN_WAIT_SECONDS = 60.0


class SpoolInUseError(RuntimeError):
    """Another live process owns the spool folder."""


QUARANTINED = Counter(
    "maas_gateway_usage_spool_quarantined",
    "Spooled lines that did not parse, moved to quarantine.jsonl instead of replayed",
)
EVENTS_FILE = "usage.jsonl"


@dataclass
class Entry:
    event: UsageEvent
    start: int
    end: int


@dataclass
class BadLine:
    start: int
    line: bytes
    error: str


@dataclass
class Batch:
    """Events read from the spool, lines that did not parse, and the offset past both."""

    entries: list[Entry] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)
    end: int = 0

    def offset_after(self, sent: int) -> int:
        """Where replay resumes once the first `sent` events are in the stream."""
        if sent == len(self.entries):
            return self.end
        return self.entries[sent].start


class UsageSpool:
    def __init__(self, directory: Path, lock_fd: int):
        """Use open() or claim(): a spool is only used by the holder of its lock."""
        self.directory = directory
        self.path = directory / EVENTS_FILE
        self._offset_path = directory / "usage.offset"
        self._quarantine_path = directory / "quarantine.jsonl"
        self._lock_fd = lock_fd
        self.lock = asyncio.Lock()
        self.path.touch()
        self._repair_tail()
        self._offset = self._read_offset()
        self.pending = self._count_from(self._offset)

    @classmethod
    def open(cls, directory: Path, wait: float = OPEN_WAIT_SECONDS) -> "UsageSpool":
        """This replica's own spool; waits up to `wait` s for a claimer replaying it.

        A claimer holds the lock for one replay; a holder that outlasts the
        wait is a live process given the same folder, a misconfiguration to
        report rather than wait out for ever.
        """
        deadline = time.monotonic() + wait
        while (fd := _lock(directory / "lock", create=True)) is None:
            if time.monotonic() > deadline:
                raise SpoolInUseError(
                    f"usage spool {directory} is held by another live process for over "
                    f"{wait:.0f} s: give each gateway replica its own --usage-spool-dir"
                )
            time.sleep(0.1)
        return cls(directory, fd)

    @classmethod
    def claim(cls, directory: Path) -> "UsageSpool | None":
        """Another replica's spool, or None while its owner (or a claimer) lives."""
        fd = _lock(directory / "lock", create=False)
        return None if fd is None else cls(directory, fd)

    def close(self) -> None:
        os.close(self._lock_fd)

    def remove(self) -> None:
        """Delete an emptied spool of a replica that is gone; quarantined lines stay."""
        self.path.unlink(missing_ok=True)
        self._offset_path.unlink(missing_ok=True)
        if not self._quarantine_path.exists():
            (self.directory / "lock").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.directory.rmdir()

    def __len__(self) -> int:
        return self.pending

    def has_events(self) -> bool:
        return self.pending > 0

    async def append(self, event: UsageEvent) -> None:
        await asyncio.to_thread(self._append, (event.model_dump_json() + "\n").encode())
        self.pending += 1

    def _append(self, line: bytes) -> None:
        with self.path.open("ab") as spool:
            size = spool.tell()
            try:
                spool.write(line)
                spool.flush()
                os.fsync(spool.fileno())
            except OSError:
                spool.truncate(size)
                raise

    def next_batch(self, limit: int) -> Batch:
        """Up to `limit` lines from the committed offset; blocking, run it in a thread."""
        batch = Batch(end=self._offset)
        with self.path.open("rb") as spool:
            spool.seek(self._offset)
            while len(batch.entries) + len(batch.bad) < limit:
                line = spool.readline()
                if not line:
                    break
                start, batch.end = batch.end, batch.end + len(line)
                if not line.strip():
                    continue
                try:
                    event = UsageEvent.model_validate_json(line)
                except ValidationError as exc:
                    error = exc.errors(include_url=False)[0]["msg"]
                    batch.bad.append(BadLine(start, line, error))
                    continue
                batch.entries.append(Entry(event, start, batch.end))
        return batch

    def commit(self, batch: Batch, sent: int) -> None:
        """Record that the first `sent` events of `batch` are in the stream.

        Bad lines before that point go to quarantine now, not when read, so a
        line read again after a failed send is quarantined once.
        """
        offset = batch.offset_after(sent)
        skipped = [bad for bad in batch.bad if bad.start < offset]
        for bad in skipped:
            self._quarantine(bad)
        self.pending -= sent + len(skipped)
        if offset >= self.path.stat().st_size:
            # Truncate before dropping the offset: a crash in between leaves an
            # offset past the end, which _read_offset takes as zero.
            os.truncate(self.path, 0)
            self._offset_path.unlink(missing_ok=True)
            self._offset = 0
            self.pending = 0
        elif offset > self._offset:
            temp = self._offset_path.with_suffix(".tmp")
            with temp.open("w") as out:
                out.write(str(offset))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self._offset_path)
            self._offset = offset

    def _quarantine(self, bad: BadLine) -> None:
        line = bad.line if bad.line.endswith(b"\n") else bad.line + b"\n"
        with self._quarantine_path.open("ab") as out:
            out.write(line)
            out.flush()
            os.fsync(out.fileno())
        QUARANTINED.inc()
        log.warning(
            "usage_spool_line_quarantined", spool=str(self.path), offset=bad.start, error=bad.error
        )

    def _repair_tail(self) -> None:
        with self.path.open("rb+") as spool:
            if spool.seek(0, os.SEEK_END) == 0:
                return
            spool.seek(-1, os.SEEK_END)
            if spool.read(1) != b"\n":
                spool.write(b"\n")
                spool.flush()
                os.fsync(spool.fileno())

    def _read_offset(self) -> int:
        try:
            offset = int(self._offset_path.read_text())
        except (FileNotFoundError, ValueError):
            return 0
        return offset if offset <= self.path.stat().st_size else 0

    def _count_from(self, offset: int) -> int:
        with self.path.open("rb") as spool:
            spool.seek(offset)
            return sum(1 for line in spool if line.strip())


def orphans(root: Path, own: Path) -> Iterator[Path]:
    """Spool directories under `root` besides `own`, claimable or not."""
    if not root.is_dir():
        return
    for directory in root.iterdir():
        if directory.is_dir() and directory != own and (directory / EVENTS_FILE).exists():
            yield directory


def _lock(path: Path, create: bool) -> int | None:
    """An exclusive flock on `path`, held by the returned descriptor; None while
    another process holds it (or, without `create`, when its folder is gone).

    The inode check closes a race with remove(): a lock taken on a lock file
    that was unlinked meanwhile guards nothing, so it is taken again.
    """
    while True:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            if create:
                continue
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
        if not create:
            return None
