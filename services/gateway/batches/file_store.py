"""Files' metadata (SQL, records.py) and their bytes (blob_store.py), per tenant.

A tenant sees only its own files: another tenant's id is a 404, as an
unknown one. Uploads (purpose "batch") count against the tenant's quotas,
`max_files` and `max_bytes`; a batch's output and error files do not (they
are the platform's answer, not the tenant's upload).
"""

import asyncio
import time
import uuid
import weakref
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.batches.blob_store import BlobStore
from maas_services.gateway.batches.records import files, lock_tenant

UPLOAD_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"


@dataclass(frozen=True)
class FileLimits:
    max_file_bytes: int = 200 * 1024 * 1024
    max_files: int = 100
    max_bytes: int = 1024 * 1024 * 1024
    # A request's body limit bounds each line.
    max_line_bytes: int = 4 * 1024 * 1024
    # OpenAI's limit on requests in one batch.
    max_lines: int = 50_000
    # Uploads one tenant may stream at once on this replica.
    max_uploads: int = 2

    @classmethod
    def from_settings(cls, settings) -> "FileLimits":
        return cls(
            settings.files_max_file_bytes,
            settings.files_max_per_tenant,
            settings.files_max_bytes_per_tenant,
            settings.max_body_bytes,
            settings.batch_max_lines,
            settings.files_max_uploads_per_tenant,
        )


@dataclass(frozen=True)
class FileRecord:
    id: str
    tenant: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    lines: int
    endpoint: str

    def object(self) -> dict:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": int(self.created_at),
            "expires_at": None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def not_found(file_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No such File object: {file_id}", param=param, code="file_not_found")


def over_quota(message: str) -> APIError:
    return APIError(413, message, param="file", code="quota_exceeded")


class FileStore:
    def __init__(self, engine: AsyncEngine, blobs: BlobStore, limits: FileLimits):
        self._engine = engine
        self.blobs = blobs
        self.limits = limits
        self._sqlite = engine.dialect.name == "sqlite"
        self._tenant_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def _lock(self, tenant: str) -> asyncio.Lock:
        lock = self._tenant_locks.get(tenant)
        if lock is None:
            lock = self._tenant_locks[tenant] = asyncio.Lock()
        return lock

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(files, bytes) of the tenant's uploads."""
        async with self._engine.connect() as conn:
            count, total = (
                await conn.execute(
                    select(func.count(), func.coalesce(func.sum(files.c.bytes), 0)).where(
                        files.c.tenant == tenant, files.c.purpose == UPLOAD_PURPOSE
                    )
                )
            ).one()
        return count, total

    def check_quota(self, count: int, total: int, adding: int) -> None:
        """413 when one more upload of `adding` bytes would pass the tenant's quotas."""
        if count + 1 > self.limits.max_files:
            raise over_quota(
                f"You have {count} files, the most your quota allows ({self.limits.max_files}); "
                "delete some first."
            )
        if total + adding > self.limits.max_bytes:
            raise over_quota(
                f"This upload would bring your files to more than your quota of "
                f"{self.limits.max_bytes} bytes ({total} bytes used)."
            )

    async def add(self, record: FileRecord, quota: bool) -> None:
        """Record a file whose blob is committed; with `quota`, within the tenant's
        quotas, checked in the transaction (replicas uploading at once included)."""
        async with self._lock(record.tenant), self._engine.begin() as conn:
            await lock_tenant(conn, "files", record.tenant)
            if quota:
                count, total = (
                    await conn.execute(
                        select(func.count(), func.coalesce(func.sum(files.c.bytes), 0)).where(
                            files.c.tenant == record.tenant, files.c.purpose == UPLOAD_PURPOSE
                        )
                    )
                ).one()
                self.check_quota(count, total, record.bytes)
            await conn.execute(insert(files).values(**record.__dict__))

    async def replace(self, record: FileRecord) -> None:
        """A batch's output file, written again by a finalizer that took over."""
        async with self._engine.begin() as conn:
            await conn.execute(delete(files).where(files.c.id == record.id))
            await conn.execute(insert(files).values(**record.__dict__))

    async def get(self, tenant: str, file_id: str) -> FileRecord | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(files).where(files.c.id == file_id, files.c.tenant == tenant)
                )
            ).first()
        return FileRecord(**row._mapping) if row else None

    async def page(
        self, tenant: str, after: str | None, limit: int, purpose: str | None
    ) -> tuple[list[FileRecord], bool]:
        """The tenant's files, newest first, after the file `after`; and whether more follow."""
        query = select(files).where(files.c.tenant == tenant)
        if purpose:
            query = query.where(files.c.purpose == purpose)
        if after:
            cursor = await self.get(tenant, after)
            if cursor is None:
                raise not_found(after, param="after")
            query = query.where(
                (files.c.created_at < cursor.created_at)
                | ((files.c.created_at == cursor.created_at) & (files.c.id < cursor.id))
            )
        query = query.order_by(files.c.created_at.desc(), files.c.id.desc()).limit(limit + 1)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [FileRecord(**r._mapping) for r in rows[:limit]], len(rows) > limit

    async def delete(self, tenant: str, file_id: str) -> bool:
        async with self._engine.begin() as conn:
            gone = await conn.execute(
                delete(files).where(files.c.id == file_id, files.c.tenant == tenant)
            )
        if not gone.rowcount:
            return False
        await self.blobs.delete(file_id)
        return True


def record(
    file_id: str, tenant: str, purpose: str, filename: str, size: int, lines=0, endpoint=""
) -> FileRecord:
    return FileRecord(file_id, tenant, purpose, filename, size, time.time(), lines, endpoint)
