"""Batches and their lines in SQL: created, claimed under a lease, answered once, finalized.

A batch's lines are rows (records.lines) that point into its input file; a
worker (worker.py) in any gateway replica claims lines with a lease,
compare-and-set on (state, lease_until), and renews the lease while they run.
A worker killed mid-line stops renewing; once its lease passes, another
claims the line and runs it again. A line's result is written once: only
by the owner of a running line, so a late writer whose lease was taken finds
no row to update. Billing dedups a line run twice by its event id, derived
from (batch, line) (batch_run.py).

Status (OpenAI's): validating (while its lines are indexed) -> in_progress ->
finalizing (output and error files written) -> completed; expired when its
completion window passes with lines not run; cancelling -> cancelled on
cancel; failed when its input cannot be read. The finalizer holds the batch's
own lease, so one replica writes its files and a killed finalizer is taken over.
"""

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.batches.blob_store import BlobStore
from maas_services.gateway.batches.records import batches, lines

WINDOWS = {"24h": 24 * 3600.0}
OPEN = ("validating", "in_progress")
# Lines inserted per statement while a batch is indexed.
INDEX_ROWS = 1000


@dataclass(frozen=True)
class BatchRecord:
    id: str
    tenant: str
    key_id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    status: str
    created_at: float
    expires_at: float
    times: dict
    metadata: dict | None
    errors: dict | None
    output_file_id: str | None
    error_file_id: str | None
    total: int
    counts: tuple[int, int]  # (completed, failed)

    def object(self) -> dict:
        completed, failed = self.counts
        times = {k: int(v) for k, v in self.times.items()}
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": self.errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": int(self.created_at),
            "in_progress_at": times.get("in_progress_at"),
            "expires_at": int(self.expires_at),
            "finalizing_at": times.get("finalizing_at"),
            "completed_at": times.get("completed_at"),
            "failed_at": times.get("failed_at"),
            "expired_at": times.get("expired_at"),
            "cancelling_at": times.get("cancelling_at"),
            "cancelled_at": times.get("cancelled_at"),
            "request_counts": {"total": self.total, "completed": completed, "failed": failed},
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class Claimed:
    """A line leased to this worker: where its request is, and its batch's owner."""

    batch_id: str
    line: int
    custom_id: str
    offset: int
    length: int
    started_at: float
    # Claims of this line so far, this one included.
    attempts: int
    tenant: str
    key_id: str
    input_file_id: str
    endpoint: str


def not_found(batch_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No batch found with id '{batch_id}'.", param=param)


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


class BatchStore:
    def __init__(self, engine: AsyncEngine, blobs: BlobStore):
        self._engine = engine
        self._blobs = blobs

    # -- the API's side -------------------------------------------------------------

    async def create(
        self,
        tenant: str,
        key_id: str,
        input_file_id: str,
        endpoint: str,
        window: str,
        metadata: dict | None,
    ) -> str:
        """A batch over the (checked) input file, its lines indexed; its id."""
        batch_id, now = new_batch_id(), time.time()
        async with self._engine.begin() as conn:
            await conn.execute(
                insert(batches).values(
                    id=batch_id,
                    tenant=tenant,
                    key_id=key_id,
                    input_file_id=input_file_id,
                    endpoint=endpoint,
                    completion_window=window,
                    status="validating",
                    created_at=now,
                    expires_at=now + WINDOWS[window],
                    times="{}",
                    metadata=json.dumps(metadata),
                    errors="null",
                )
            )
        try:
            await self._index_lines(batch_id, input_file_id)
        except Exception as exc:
            # The file checked at upload cannot be read now (deleted, the volume gone).
            errors = {
                "object": "list",
                "data": [
                    {"code": "invalid_file", "message": str(exc), "param": None, "line": None}
                ],
            }
            async with self._engine.begin() as conn:
                await conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id)
                    .values(
                        status="failed",
                        errors=json.dumps(errors),
                        times=json.dumps({"failed_at": time.time()}),
                    )
                )
        return batch_id

    async def _index_lines(self, batch_id: str, input_file_id: str) -> None:
        total = 0
        async with self._engine.begin() as conn:
            rows = []
            async for number, offset, length, custom_id in self._index(input_file_id):
                rows.append(
                    {
                        "batch_id": batch_id,
                        "line": number,
                        "custom_id": custom_id,
                        "offset": offset,
                        "length": length,
                        "state": "pending",
                    }
                )
                if len(rows) == INDEX_ROWS:
                    await conn.execute(insert(lines), rows)
                    total += len(rows)
                    rows = []
            if rows:
                await conn.execute(insert(lines), rows)
                total += len(rows)
            await conn.execute(
                update(batches)
                .where(batches.c.id == batch_id)
                .values(
                    status="in_progress",
                    total=total,
                    times=json.dumps({"in_progress_at": time.time()}),
                )
            )

    async def _index(self, file_id: str) -> AsyncIterator[tuple[int, int, int, str]]:
        """(line number, offset, length, custom_id) of each request in a checked file."""
        offset, number, partial = 0, 0, b""
        async for chunk in self._blobs.read(file_id):
            data = partial + chunk
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                number += 1
                raw = data[start:end]
                if raw.strip():
                    yield number, offset + start, end - start, msgspec.json.decode(raw)["custom_id"]
                start = end + 1
            offset += start
            partial = data[start:]
        if partial.strip():
            yield number + 1, offset, len(partial), msgspec.json.decode(partial)["custom_id"]

    async def get(self, tenant: str, batch_id: str) -> BatchRecord | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(batches).where(batches.c.id == batch_id, batches.c.tenant == tenant)
                )
            ).first()
            if row is None:
                return None
            counts = await self._counts(conn, batch_id)
        return _record(row, counts)

    async def _counts(self, conn, batch_id: str) -> tuple[int, int]:
        rows = (
            await conn.execute(
                select(lines.c.ok, func.count())
                .where(lines.c.batch_id == batch_id, lines.c.state == "done")
                .group_by(lines.c.ok)
            )
        ).all()
        by_ok = {bool(ok): count for ok, count in rows}
        return by_ok.get(True, 0), by_ok.get(False, 0)

    async def page(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[BatchRecord], bool]:
        """The tenant's batches, newest first, after the batch `after`; and whether more follow."""
        query = select(batches).where(batches.c.tenant == tenant)
        async with self._engine.connect() as conn:
            if after:
                cursor = (
                    await conn.execute(
                        select(batches.c.created_at).where(
                            batches.c.id == after, batches.c.tenant == tenant
                        )
                    )
                ).first()
                if cursor is None:
                    raise not_found(after, param="after")
                query = query.where(
                    (batches.c.created_at < cursor.created_at)
                    | ((batches.c.created_at == cursor.created_at) & (batches.c.id < after))
                )
            query = query.order_by(batches.c.created_at.desc(), batches.c.id.desc())
            rows = (await conn.execute(query.limit(limit + 1))).all()
            found = [_record(r, await self._counts(conn, r.id)) for r in rows[:limit]]
        return found, len(rows) > limit

    async def cancel(self, tenant: str, batch_id: str) -> BatchRecord | None:
        """Mark an open batch cancelling (its running lines finish, no more start)."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    select(batches.c.status, batches.c.times).where(
                        batches.c.id == batch_id, batches.c.tenant == tenant
                    )
                )
            ).first()
            if row is None:
                return None
            if row.status in OPEN:
                times = {**json.loads(row.times), "cancelling_at": time.time()}
                await conn.execute(
                    update(batches)
                    .where(batches.c.id == batch_id, batches.c.status.in_(OPEN))
                    .values(status="cancelling", times=json.dumps(times))
                )
        return await self.get(tenant, batch_id)

    # -- the workers' side ----------------------------------------------------------

    async def claim(self, owner: str, lease: float, limit: int) -> list[Claimed]:
        """Up to `limit` lines to run: pending ones due, or running ones whose lease passed."""
        now = time.time()
        due = or_(
            and_(lines.c.state == "pending", lines.c.lease_until <= now),
            and_(lines.c.state == "running", lines.c.lease_until < now),
        )
        query = (
            select(
                lines,
                batches.c.tenant,
                batches.c.key_id,
                batches.c.input_file_id,
                batches.c.endpoint,
            )
            .join(batches, batches.c.id == lines.c.batch_id)
            .where(batches.c.status == "in_progress", batches.c.expires_at > now, due)
            .order_by(batches.c.created_at, lines.c.line)
            .limit(limit)
        )
        claimed = []
        async with self._engine.begin() as conn:
            for row in (await conn.execute(query)).all():
                started = row.started_at or now
                taken = await conn.execute(
                    update(lines)
                    .where(
                        lines.c.batch_id == row.batch_id,
                        lines.c.line == row.line,
                        lines.c.state == row.state,
                        lines.c.lease_until == row.lease_until,
                    )
                    .values(
                        state="running",
                        owner=owner,
                        lease_until=now + lease,
                        attempts=lines.c.attempts + 1,
                        started_at=started,
                    )
                )
                if taken.rowcount:
                    claimed.append(
                        Claimed(
                            row.batch_id,
                            row.line,
                            row.custom_id,
                            row.offset,
                            row.length,
                            started,
                            row.attempts + 1,
                            row.tenant,
                            row.key_id,
                            row.input_file_id,
                            row.endpoint,
                        )
                    )
        return claimed

    async def renew(self, owner: str, lease: float) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(
                update(lines)
                .where(lines.c.owner == owner, lines.c.state == "running")
                .values(lease_until=time.time() + lease)
            )

    async def answer(self, line: Claimed, owner: str, ok: bool, result: dict) -> bool:
        """Write a line's result, once: False when this worker no longer owns it."""
        async with self._engine.begin() as conn:
            written = await conn.execute(
                update(lines)
                .where(
                    lines.c.batch_id == line.batch_id,
                    lines.c.line == line.line,
                    lines.c.state == "running",
                    lines.c.owner == owner,
                )
                .values(state="done", ok=ok, result=json.dumps(result), owner="")
            )
        return bool(written.rowcount)

    async def put_back(self, line: Claimed, owner: str, delay: float) -> None:
        """A line admission refused for now (429/503): pending again, due in `delay` seconds."""
        async with self._engine.begin() as conn:
            await conn.execute(
                update(lines)
                .where(
                    lines.c.batch_id == line.batch_id,
                    lines.c.line == line.line,
                    lines.c.state == "running",
                    lines.c.owner == owner,
                )
                .values(state="pending", owner="", lease_until=time.time() + delay)
            )

    async def take_finished(self, owner: str, lease: float) -> list[str]:
        """Batches ready to finalize, leased to `owner`: in_progress with every line done,
        or its window passed; cancelling; or finalizing under a lapsed lease."""
        now = time.time()
        running = (
            select(lines.c.batch_id)
            .where(
                lines.c.batch_id == batches.c.id,
                lines.c.state == "running",
                lines.c.lease_until >= now,
            )
            .exists()
        )
        open_lines = (
            select(lines.c.batch_id)
            .where(lines.c.batch_id == batches.c.id, lines.c.state != "done")
            .exists()
        )
        ready = or_(
            and_(batches.c.status == "in_progress", ~open_lines),
            and_(batches.c.status == "in_progress", batches.c.expires_at <= now, ~running),
            and_(batches.c.status == "cancelling", batches.c.lease_until < now, ~running),
            and_(batches.c.status == "finalizing", batches.c.lease_until < now),
        )
        taken = []
        async with self._engine.begin() as conn:
            rows = (
                await conn.execute(
                    select(batches.c.id, batches.c.status, batches.c.lease_until, batches.c.times)
                    .where(ready)
                    .limit(8)
                )
            ).all()
            for row in rows:
                times = json.loads(row.times)
                status = "cancelling" if row.status == "cancelling" else "finalizing"
                times.setdefault(f"{status}_at", now)
                result = await conn.execute(
                    update(batches)
                    .where(
                        batches.c.id == row.id,
                        batches.c.status == row.status,
                        batches.c.lease_until == row.lease_until,
                    )
                    .values(
                        status=status, owner=owner, lease_until=now + lease, times=json.dumps(times)
                    )
                )
                if result.rowcount:
                    taken.append(row.id)
        return taken

    async def finishing(self, batch_id: str) -> tuple[BatchRecord, bool]:
        """The batch being finalized, and whether any of its lines never ran."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(batches).where(batches.c.id == batch_id))).one()
            counts = await self._counts(conn, batch_id)
            unrun = (
                await conn.execute(
                    select(func.count()).where(
                        lines.c.batch_id == batch_id, lines.c.state != "done"
                    )
                )
            ).scalar_one()
        return _record(row, counts), unrun > 0

    async def results(self, batch_id: str) -> AsyncIterator[tuple[bool | None, str, str]]:
        """Every line in order: (ok, or None when it never ran; custom_id; result JSON)."""
        last = 0
        while True:
            async with self._engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(
                            lines.c.line,
                            lines.c.ok,
                            lines.c.custom_id,
                            lines.c.result,
                            lines.c.state,
                        )
                        .where(lines.c.batch_id == batch_id, lines.c.line > last)
                        .order_by(lines.c.line)
                        .limit(INDEX_ROWS)
                    )
                ).all()
            if not rows:
                return
            for row in rows:
                done = row.state == "done"
                yield (bool(row.ok) if done else None), row.custom_id, row.result or ""
            last = rows[-1].line

    async def finish(
        self,
        batch_id: str,
        owner: str,
        status: str,
        output: str | None,
        errors: str | None,
        failure: dict | None = None,
    ) -> None:
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(select(batches.c.times).where(batches.c.id == batch_id))
            ).one()
            times = {**json.loads(row.times), f"{status}_at": time.time()}
            await conn.execute(
                update(batches)
                .where(batches.c.id == batch_id, batches.c.owner == owner)
                .values(
                    status=status,
                    output_file_id=output,
                    error_file_id=errors,
                    times=json.dumps(times),
                    owner="",
                    lease_until=0.0,
                    errors=json.dumps(failure),
                )
            )
            # Lines that never ran are done now: nothing claims them again.
            await conn.execute(
                update(lines)
                .where(lines.c.batch_id == batch_id, lines.c.state == "pending")
                .values(state="done", ok=False)
            )


def _record(row, counts: tuple[int, int]) -> BatchRecord:
    return BatchRecord(
        id=row.id,
        tenant=row.tenant,
        key_id=row.key_id,
        input_file_id=row.input_file_id,
        endpoint=row.endpoint,
        completion_window=row.completion_window,
        status=row.status,
        created_at=row.created_at,
        expires_at=row.expires_at,
        times=json.loads(row.times),
        metadata=json.loads(row.metadata),
        errors=json.loads(row.errors),
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        total=row.total,
        counts=counts,
    )
