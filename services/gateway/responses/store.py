"""Stored responses: what `store: true` keeps, for GET/DELETE and `previous_response_id`.

One relational table through SQLAlchemy Core (async): an embedded SQLite
file by default (`maas up`), a shared PostgreSQL when several gateway
replicas serve (each must see what another stored). A row holds the response
object as returned and the conversation a next turn continues from (every
message before it, its own output included), so a row is self-contained:
deleting, evicting or expiring one never breaks another's chain.

Bounded per tenant, before each write: at most `max_per_tenant` rows and
`max_bytes_per_tenant` bytes. A write that would pass a bound evicts that
tenant's oldest rows first (OpenAI keeps a tenant's responses; a client does
not expect its newest to be refused after it was generated and billed), so a
tenant that floods the store only ever loses its own old responses. A row
larger than the whole byte bound is not stored (`put` says so). Rows expire
`ttl_seconds` after they were written: invisible at once, deleted by the
next write. The bound is enforced in the write's transaction under a
per-tenant lock (SQLite: the database's one writer; PostgreSQL: a
transaction-scoped advisory lock on the tenant), so replicas writing at once
cannot pass it together. Within a replica, writes queue in FIFO order, one
per tenant at a time, so a flooding tenant delays another's write by at most
one of its own (benchmarks/responses_bench.py).
"""

import asyncio
import contextlib
import time
import weakref
from dataclasses import dataclass

import msgspec
from prometheus_client import Counter
from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.schema import CreateIndex, CreateTable

from maas_services.common.sql_engine import open_engine

EVICTED = Counter(
    "maas_gateway_responses_evicted",
    "stored responses removed to keep a tenant within its bound, or expired",
    ["reason"],
)

# Rows looked at per round when choosing which of a tenant's oldest to evict.
EVICTION_BATCH = 256

metadata = MetaData()
responses = Table(
    "maas_responses",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(255), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("body", Text, nullable=False),
    Column("conversation", Text, nullable=False),
    Index("ix_maas_responses_tenant_created", "tenant", "created_at"),
    Index("ix_maas_responses_expires", "expires_at"),
)

_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class StoreLimits:
    max_per_tenant: int = 10_000
    max_bytes_per_tenant: int = 64 * 1024 * 1024
    ttl_seconds: float = 30 * 24 * 3600.0

    @classmethod
    def from_settings(cls, settings) -> "StoreLimits":
        return cls(
            settings.responses_max_per_tenant,
            settings.responses_max_bytes_per_tenant,
            settings.responses_ttl_seconds,
        )


@dataclass(frozen=True)
class StoredResponse:
    body: dict
    # Chat messages (schemas.ChatMessage as dicts) a next turn continues from.
    conversation: list[dict]


# A plain URL (as billing's setting takes it too) gets the async driver.
class ResponseStore:
    def __init__(self, engine: AsyncEngine, limits: StoreLimits):
        self._engine = engine
        self.limits = limits
        self._postgres = engine.dialect.name == "postgresql"
        # One write at a time per tenant in this process, then (SQLite, one
        # writer) one at a time in all: asyncio's locks are FIFO, so another
        # tenant's write waits for at most one of a flooder's, where SQLite's
        # own busy wait (sleeps, no queue) let it wait seconds (docs/responses.md).
        self._tenant_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._writer = contextlib.nullcontext() if self._postgres else asyncio.Lock()

    @classmethod
    async def open(cls, url: str, limits: StoreLimits) -> "ResponseStore":
        # A database that does not answer costs a request seconds, not minutes:
        # a read is then a 503, a write an answer marked store: false.
        engine = open_engine(url, connect_seconds=5, command_seconds=10)
        async with engine.begin() as conn:
            # Replicas starting together: IF NOT EXISTS, and on PostgreSQL (whose
            # catalog can still race on it) one at a time.
            if engine.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('maas_responses'))"))
            await conn.execute(CreateTable(responses, if_not_exists=True))
            for index in responses.indexes:
                await conn.execute(CreateIndex(index, if_not_exists=True))
        return cls(engine, limits)

    async def close(self) -> None:
        await self._engine.dispose()

    async def put(
        self, tenant: str, response_id: str, body: dict, conversation: list[dict]
    ) -> bool:
        """Store a response, evicting the tenant's oldest to stay within its bounds;
        False (nothing stored, nothing evicted) when it alone is over the byte bound."""
        body_json, conversation_json = _encode(body).decode(), _encode(conversation).decode()
        size = len(body_json.encode()) + len(conversation_json.encode())
        if size > self.limits.max_bytes_per_tenant:
            return False
        lock = self._tenant_locks.get(tenant)
        if lock is None:
            lock = self._tenant_locks[tenant] = asyncio.Lock()
        async with lock, self._writer:
            return await self._put(tenant, response_id, size, body_json, conversation_json)

    async def _put(
        self, tenant: str, response_id: str, size: int, body_json: str, conversation_json: str
    ) -> bool:
        now = time.time()
        async with self._engine.begin() as conn:
            if self._postgres:
                await conn.execute(
                    text("SELECT pg_advisory_xact_lock(hashtext(:tenant))"), {"tenant": tenant}
                )
            # A write first: on SQLite it takes the database's write lock, so the
            # totals read next cannot change before this transaction commits.
            expired = await conn.execute(delete(responses).where(responses.c.expires_at <= now))
            if expired.rowcount:
                EVICTED.labels("expired").inc(expired.rowcount)
            await self._make_room(conn, tenant, size)
            await conn.execute(
                insert(responses).values(
                    id=response_id,
                    tenant=tenant,
                    created_at=now,
                    expires_at=now + self.limits.ttl_seconds,
                    bytes=size,
                    body=body_json,
                    conversation=conversation_json,
                )
            )
        return True

    async def _make_room(self, conn: AsyncConnection, tenant: str, size: int) -> None:
        """Delete the tenant's oldest rows until one more of `size` bytes fits."""
        count, total = (
            await conn.execute(
                select(func.count(), func.coalesce(func.sum(responses.c.bytes), 0)).where(
                    responses.c.tenant == tenant
                )
            )
        ).one()
        rows_over = count + 1 - self.limits.max_per_tenant
        bytes_over = total + size - self.limits.max_bytes_per_tenant
        while rows_over > 0 or bytes_over > 0:
            oldest = (
                await conn.execute(
                    select(responses.c.id, responses.c.bytes)
                    .where(responses.c.tenant == tenant)
                    .order_by(responses.c.created_at, responses.c.id)
                    .limit(EVICTION_BATCH)
                )
            ).all()
            victims = []
            for row_id, row_bytes in oldest:
                if rows_over <= 0 and bytes_over <= 0:
                    break
                victims.append(row_id)
                rows_over -= 1
                bytes_over -= row_bytes
            await conn.execute(delete(responses).where(responses.c.id.in_(victims)))
            EVICTED.labels("tenant_bound").inc(len(victims))

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's response, None when it is not theirs, deleted or expired."""
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(responses.c.body, responses.c.conversation).where(
                        responses.c.id == response_id,
                        responses.c.tenant == tenant,
                        responses.c.expires_at > time.time(),
                    )
                )
            ).first()
        if row is None:
            return None
        return StoredResponse(msgspec.json.decode(row.body), msgspec.json.decode(row.conversation))

    async def delete(self, tenant: str, response_id: str) -> bool:
        async with self._writer, self._engine.begin() as conn:
            result = await conn.execute(
                delete(responses).where(
                    responses.c.id == response_id,
                    responses.c.tenant == tenant,
                    responses.c.expires_at > time.time(),
                )
            )
        return result.rowcount > 0

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(rows, bytes) the tenant holds now, expired rows not yet deleted included."""
        async with self._engine.connect() as conn:
            count, total = (
                await conn.execute(
                    select(func.count(), func.coalesce(func.sum(responses.c.bytes), 0)).where(
                        responses.c.tenant == tenant
                    )
                )
            ).one()
        return count, total
