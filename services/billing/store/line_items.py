"""The relational ledger: a batch of line items written exactly once, and read back.

`commit` is the consumer's one transaction per batch: a multi-row
`INSERT ... ON CONFLICT DO NOTHING RETURNING` of the batch's line items (the
unique key (request_id, day) is the dedup: a redelivered or duplicated event
inserts nothing), the hourly and daily rollups of the rows actually inserted,
and the outbox row that says what those rows add to Redis's running totals.
Only after that commit does the consumer touch Redis and XACK; then it
deletes the outbox row (`forget`). A crash between the commit and Redis
leaves the outbox row, which any replica applies later (`claim_unapplied`);
Redis refuses to apply one batch twice (running_totals.py). So a line item is
billed once whatever dies when.

Reads serve `GetUsage`'s buckets (from the rollups, so they outlive the line
items' retention as the Redis buckets did), `ListLineItems` and
`maas billing line-items` (the tenant-and-time index), and reconcile.
"""

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from sqlalchemy import Table, delete, func, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from maas_services.billing.store.partitions import AHEAD_DAYS, DAY, Partitions, day_of
from maas_services.billing.store.schema import (
    SUMS,
    batches,
    create_schema,
    line_items,
    usage_days,
    usage_hours,
)
from maas_services.common.sql_engine import open_engine

HOUR = 3600
IN_MEMORY = "sqlite+aiosqlite://"
# `maas up`'s state folder; the local stack passes its own (MAAS_BILLING_DATABASE_URL).
DEFAULT_DATABASE_URL = "sqlite:///.maas/billing.db"


@dataclass(frozen=True)
class LineItem:
    request_id: str
    tenant: str
    key_id: str
    model: str
    deployment: str
    started_at: float
    finished_at: float
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    cost_nano_usd: int
    finish_reason: str = ""
    # The LoRA adapter the request ran with, "" for the base model.
    adapter: str = ""

    @property
    def day(self) -> int:
        return day_of(self.started_at)

    def row(self) -> dict:
        # By hand: dataclasses.asdict deep-copies every field, a tenth of the
        # consumer's CPU at 500 rows a batch.
        return {
            "request_id": self.request_id,
            "day": self.day,
            "tenant": self.tenant,
            "key_id": self.key_id,
            "model": self.model,
            "deployment": self.deployment,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_nano_usd": self.cost_nano_usd,
            "finish_reason": self.finish_reason,
            "adapter": self.adapter,
        }


@dataclass
class Totals:
    """Totals of line items: a bucket, a tenant's running totals, a reconcile row."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_nano_usd: int = 0

    @classmethod
    def from_hash(cls, raw: dict[str, str], prefix: str = "") -> "Totals":
        """From a Redis hash of running totals (fields under `prefix`)."""
        return cls(**{f: int(raw.get(prefix + f, 0)) for f in SUMS})

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, item: LineItem) -> None:
        self.requests += 1
        self.prompt_tokens += item.prompt_tokens
        self.cached_prompt_tokens += item.cached_prompt_tokens
        self.completion_tokens += item.completion_tokens
        self.cost_nano_usd += item.cost_nano_usd


def _insert(conn: AsyncConnection, table: Table):
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


class LineItemStore:
    def __init__(self, url: str = IN_MEMORY):
        # A database that does not answer fails the pass (and is retried),
        # rather than hanging the consumer.
        self.engine = open_engine(url, connect_seconds=10, command_seconds=60)
        self.partitions = Partitions()
        self._started = False
        # The consumer's first pass and the upkeep's first round start the store at
        # once: on SQLite (no advisory lock, schema.py) both saw no tables and the
        # second CREATE TABLE failed, on every fresh `maas up`.
        self._starting = asyncio.Lock()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    async def start(self) -> None:
        """Create or upgrade the schema and today's and the next days' partitions."""
        async with self._starting:
            async with self.engine.begin() as conn:
                await create_schema(conn)
            self._started = True
        await self.ensure_partitions_ahead()

    async def _ready(self) -> None:
        """Every use starts the store first, once: a reader (the admin CLI, the
        servicer before the consumer's first pass) may come first."""
        if not self._started:
            await self.start()

    async def ensure_partitions_ahead(self) -> None:
        today = day_of(time.time())
        await self.ensure_partitions({today + i for i in range(AHEAD_DAYS + 1)})

    async def ensure_partitions(self, days: set[int]) -> None:
        # Known days cost nothing: no transaction on the batch's path.
        if self.dialect == "postgresql" and self.partitions.unknown(days):
            async with self.engine.begin() as conn:
                await self.partitions.ensure(conn, days)

    async def close(self) -> None:
        await self.engine.dispose()

    async def commit(
        self,
        batch_id: str,
        consumer: str,
        items: list[LineItem],
        effects: Callable[[list[LineItem]], str],
    ) -> tuple[list[LineItem], str]:
        """Insert the items in one transaction; the ones that were new, and
        `effects(new)`: what they add to Redis, stored in the outbox row
        `batch_id` of the same transaction ('' and no row when nothing is new)."""
        await self._ready()
        if not items:
            return [], ""
        await self.ensure_partitions({item.day for item in items})
        async with self.engine.begin() as conn:
            result = await conn.execute(
                _insert(conn, line_items)
                .on_conflict_do_nothing()
                .returning(line_items.c.request_id, line_items.c.day),
                [item.row() for item in items],
            )
            inserted_keys = {(request_id, day) for request_id, day in result}
            inserted = [i for i in items if (i.request_id, i.day) in inserted_keys]
            change = effects(inserted) if inserted else ""
            if inserted:
                await self._roll_up(conn, usage_hours, inserted, HOUR)
                await self._roll_up(conn, usage_days, inserted, DAY)
                await conn.execute(
                    batches.insert().values(
                        id=batch_id,
                        consumer=consumer,
                        created_at=time.time(),
                        effects=change,
                    )
                )
        return inserted, change

    async def _roll_up(
        self, conn: AsyncConnection, table: Table, items: list[LineItem], size: int
    ) -> None:
        sums: dict[tuple[str, int], Totals] = defaultdict(Totals)
        for item in items:
            sums[(item.tenant, int(item.finished_at // size) * size)].add(item)
        stmt = _insert(conn, table)
        stmt = stmt.on_conflict_do_update(
            index_elements=["tenant", "start"],
            set_={name: table.c[name] + stmt.excluded[name] for name in SUMS},
        )
        # In key order: two replicas updating the same rows lock them in one
        # order, so they wait for each other instead of deadlocking.
        rows = [{"tenant": t, "start": s, **asdict(v)} for (t, s), v in sorted(sums.items())]
        await conn.execute(stmt, rows)

    async def import_items(self, items: list[LineItem]) -> None:
        """Insert line items an older release kept in Redis (migration.py):
        no rollups, no outbox, Redis has counted them already."""
        await self._ready()
        await self.ensure_partitions({item.day for item in items})
        async with self.engine.begin() as conn:
            await conn.execute(
                _insert(conn, line_items).on_conflict_do_nothing(), [i.row() for i in items]
            )

    async def import_bucket(self, tenant: str, start: int, size: int, totals: Totals) -> None:
        """Insert an older release's hour or day bucket, unless the row exists."""
        await self._ready()
        table = usage_hours if size == HOUR else usage_days
        async with self.engine.begin() as conn:
            await conn.execute(
                _insert(conn, table).on_conflict_do_nothing(),
                [{"tenant": tenant, "start": start, **asdict(totals)}],
            )

    async def forget(self, batch_id: str) -> None:
        """The batch's effects are in Redis: drop its outbox row."""
        await self._ready()
        async with self.engine.begin() as conn:
            await conn.execute(delete(batches).where(batches.c.id == batch_id))

    async def claim_unapplied(
        self, older_than: float, apply: Callable[[str, str], object], limit: int = 100
    ) -> int:
        """Apply outbox rows older than `older_than` seconds with `apply(id, effects)`
        (awaited), deleting each in the transaction that locked it; how many.

        PostgreSQL locks the rows it takes (SKIP LOCKED: replicas recovering at
        once share them out); applying one twice is harmless anyway, Redis
        refuses the second (running_totals.py)."""
        await self._ready()
        query = (
            select(batches.c.id, batches.c.effects)
            .where(batches.c.created_at < time.time() - older_than)
            .order_by(batches.c.created_at)
            .limit(limit)
        )
        if self.dialect == "postgresql":
            query = query.with_for_update(skip_locked=True)
        async with self.engine.begin() as conn:
            rows = (await conn.execute(query)).all()
            for batch_id, effects in rows:
                await apply(batch_id, effects)
                await conn.execute(delete(batches).where(batches.c.id == batch_id))
        return len(rows)

    async def unapplied(self) -> int:
        await self._ready()
        async with self.engine.connect() as conn:
            return (await conn.execute(select(func.count()).select_from(batches))).scalar_one()

    async def items(
        self, tenant: str, start: float, end: float, offset: int = 0, limit: int | None = None
    ) -> list[dict]:
        """A tenant's line items that started in [start, end), oldest first."""
        await self._ready()
        query = (
            select(line_items)
            .where(
                line_items.c.tenant == tenant,
                line_items.c.started_at >= start,
                line_items.c.started_at < end,
            )
            .order_by(line_items.c.started_at, line_items.c.request_id)
            .offset(offset)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            return [dict(row._mapping) for row in await conn.execute(query)]

    async def buckets(
        self, tenant: str, start: int, end: int, size: int
    ) -> list[tuple[int, Totals]]:
        """The rollup rows of [start, end) (hour or day size), oldest first."""
        await self._ready()
        table = usage_hours if size == HOUR else usage_days
        query = (
            select(table)
            .where(
                table.c.tenant == tenant,
                table.c.start >= int(start // size) * size,
                table.c.start < end,
            )
            .order_by(table.c.start)
        )
        async with self.engine.connect() as conn:
            rows = await conn.execute(query)
            return [(row.start, Totals(**{n: getattr(row, n) for n in SUMS})) for row in rows]

    async def tenant_sums(self, tenants: Iterable[str] | None = None) -> dict[str, Totals]:
        """Each tenant's all-time sums by the daily rollup (reconcile)."""
        await self._ready()
        query = select(usage_days.c.tenant, *(func.sum(usage_days.c[n]) for n in SUMS)).group_by(
            usage_days.c.tenant
        )
        if tenants is not None:
            query = query.where(usage_days.c.tenant.in_(list(tenants)))
        async with self.engine.connect() as conn:
            return {row[0]: Totals(*map(int, row[1:])) for row in await conn.execute(query)}

    async def tenants_since(self, since: float) -> list[str]:
        """Tenants billed for a day that ended after `since` (reconcile)."""
        await self._ready()
        query = (
            select(usage_days.c.tenant)
            .where(usage_days.c.start > since - DAY)
            .distinct()
            .order_by(usage_days.c.tenant)
        )
        async with self.engine.connect() as conn:
            return list((await conn.execute(query)).scalars())

    async def tenants_first_billed_since(self, since: float) -> list[str]:
        """Tenants whose every line item started after `since`."""
        await self._ready()
        query = (
            select(line_items.c.tenant)
            .group_by(line_items.c.tenant)
            .having(func.min(line_items.c.started_at) >= since)
        )
        async with self.engine.connect() as conn:
            return sorted((await conn.execute(query)).scalars())

    async def hours_from_items(self, start: int, end: int) -> dict[tuple[str, int], Totals]:
        """Per tenant and hour of finish, recomputed from the line items of requests
        that finished in [start, end) (reconcile)."""
        await self._ready()
        hour = func.floor(line_items.c.finished_at / HOUR) * HOUR
        query = (
            select(
                line_items.c.tenant,
                hour.label("hour"),
                func.count(),
                *(func.sum(line_items.c[n]) for n in SUMS[1:]),
            )
            .where(line_items.c.finished_at >= start, line_items.c.finished_at < end)
            .group_by(line_items.c.tenant, hour)
        )
        async with self.engine.connect() as conn:
            return {
                (row[0], int(row[1])): Totals(*map(int, row[2:]))
                for row in await conn.execute(query)
            }

    async def hours_rolled_up(self, start: int, end: int) -> dict[tuple[str, int], Totals]:
        await self._ready()
        query = select(usage_hours).where(usage_hours.c.start >= start, usage_hours.c.start < end)
        async with self.engine.connect() as conn:
            return {
                (row.tenant, row.start): Totals(**{n: getattr(row, n) for n in SUMS})
                for row in await conn.execute(query)
            }

    async def expire(
        self, line_items_before: float, hours_before: float, days_before: float
    ) -> None:
        """Retention: whole days of line items, and rollup rows older than their keep."""
        await self._ready()
        async with self.engine.begin() as conn:
            await self.partitions.drop_before(conn, day_of(line_items_before))
            await conn.execute(delete(usage_hours).where(usage_hours.c.start < hours_before))
            await conn.execute(delete(usage_days).where(usage_days.c.start < days_before))

    async def size_bytes(self) -> int | None:
        """The database's size on disk (PostgreSQL), for the soak."""
        await self._ready()
        if self.dialect != "postgresql":
            return None
        async with self.engine.connect() as conn:
            return (
                await conn.execute(text("SELECT pg_database_size(current_database())"))
            ).scalar()
