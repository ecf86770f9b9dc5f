"""Where file contents live: a blob store interface and its directory implementation.

Metadata (owner, size, purpose) is in SQL (file_store.py); the bytes are here,
named by file id. A write goes to a temporary name and is renamed into place
when complete, so a reader never sees half a file and an interrupted upload
leaves only a temporary (deleted by `discard`, or on the next start).

The directory is `.maas/files` locally and a PersistentVolume in the chart
(charts/maas, gateway.files.persistence): every gateway replica must mount the
same volume (ReadWriteMany) so any replica serves any file. An S3-compatible
bucket would be a second implementation of BlobStore; it is not built yet
(docs/batches.md says why).
"""

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

# Bytes read from a blob per step: large enough for few thread hops, small
# enough that a download holds little.
READ_CHUNK = 1 << 20


class BlobWriter(Protocol):
    async def write(self, data: bytes) -> None: ...

    async def commit(self) -> None: ...

    async def discard(self) -> None: ...


class BlobStore(Protocol):
    def writer(self, blob_id: str) -> BlobWriter: ...

    def read(
        self, blob_id: str, start: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]: ...

    async def delete(self, blob_id: str) -> None: ...


class DirectoryWriter:
    """Appends to a temporary file beside the blob; buffered so each thread hop
    writes about a megabyte, not one socket read."""

    def __init__(self, final: Path):
        self._final = final
        self._temp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.part")
        self._file = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    async def write(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= READ_CHUNK:
            await self._flush()

    async def _flush(self) -> None:
        data, self._pending, self._pending_bytes = b"".join(self._pending), [], 0
        await asyncio.to_thread(self._append, data)

    def _append(self, data: bytes) -> None:
        if self._file is None:
            self._file = open(self._temp, "wb")  # noqa: SIM115 - closed by commit/discard
        self._file.write(data)

    async def commit(self) -> None:
        await self._flush()
        await asyncio.to_thread(self._finish)

    def _finish(self) -> None:
        if self._file is None:
            self._file = open(self._temp, "wb")  # noqa: SIM115 - an empty blob
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._temp, self._final)

    async def discard(self) -> None:
        self._pending = []
        await asyncio.to_thread(self._remove)

    def _remove(self) -> None:
        if self._file is not None:
            self._file.close()
        self._temp.unlink(missing_ok=True)


class DirectoryBlobStore:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # Temporaries a killed process left behind.
        for stale in root.glob(".*.part"):
            stale.unlink(missing_ok=True)

    def _path(self, blob_id: str) -> Path:
        # Ids are ours (file_store.new_file_id), never a client's path.
        if not blob_id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"not a blob id: {blob_id!r}")
        return self.root / blob_id

    def writer(self, blob_id: str) -> DirectoryWriter:
        return DirectoryWriter(self._path(blob_id))

    async def read(
        self, blob_id: str, start: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """The blob's bytes from `start`, `length` of them (None: to the end), a chunk at a time."""
        handle = await asyncio.to_thread(open, self._path(blob_id), "rb")
        try:
            await asyncio.to_thread(handle.seek, start)
            left = length
            while left is None or left > 0:
                size = READ_CHUNK if left is None else min(READ_CHUNK, left)
                chunk = await asyncio.to_thread(handle.read, size)
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk
        finally:
            handle.close()

    async def read_all(self, blob_id: str, start: int, length: int) -> bytes:
        """A small range (one JSONL line), whole."""
        return b"".join([chunk async for chunk in self.read(blob_id, start, length)])

    async def delete(self, blob_id: str) -> None:
        await asyncio.to_thread(self._path(blob_id).unlink, True)
