"""The tables billing keeps in its database, and their idempotent creation.

One SQL layer serves PostgreSQL (the chart) and SQLite (`maas up`'s embedded
default): SQLAlchemy 2 Core on its async engines, asyncpg and aiosqlite.
Chosen over psycopg 3 because Core writes the one thing the two dialects
spell differently, `INSERT ... ON CONFLICT`, from one statement, batches a
multi-row insert with RETURNING itself ("insertmanyvalues"), and asyncpg is
the faster driver for the consumer's hot path; no ORM, only tables.

Tables:
  line_items    one row per billed request; unique on (request_id, day), the
                dedup key; in PostgreSQL RANGE-partitioned by `day` (Unix day
                of the request's start), one partition a day (partitions.py)
  usage_hours   per tenant and hour of finish: the sums `GetUsage` buckets
  usage_days    per tenant and day of finish; kept longer than the hours
  batches       the outbox: a committed batch's effects on Redis's running
                totals, deleted once Redis has them (line_items.py)
  schema_version  which of MIGRATIONS this database has

MIGRATIONS is the list of schema versions; `create_schema` brings a database
to the last one under a lock, so replicas starting together are safe.
"""

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection

metadata = MetaData()

SUMS = ("requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "cost_nano_usd")


def _sum_columns() -> list[Column]:
    return [Column(name, BigInteger, nullable=False, server_default="0") for name in SUMS]


line_items = Table(
    "line_items",
    metadata,
    Column("request_id", String, nullable=False),
    Column("day", Integer, nullable=False),
    Column("tenant", String, nullable=False),
    Column("key_id", String, nullable=False, server_default=""),
    Column("model", String, nullable=False),
    Column("deployment", String, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("cached_prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("cost_nano_usd", BigInteger, nullable=False),
    # Why it ended; client_disconnect and first_token_timeout mark a request
    # cut short (docs/billing.md, "Requests cut short").
    Column("finish_reason", String, nullable=False, server_default=""),
    # The LoRA adapter it ran with, "" for the base model (schema version 2).
    Column("adapter", String, nullable=False, server_default=""),
    PrimaryKeyConstraint("request_id", "day"),
    # ListLineItems and `maas billing line-items`: a tenant's items by time.
    Index("line_items_tenant_time", "tenant", "started_at"),
    postgresql_partition_by="RANGE (day)",
)


def _rollup(name: str) -> Table:
    """A tenant's sums per bucket, the bucket named by its start."""
    return Table(
        name,
        metadata,
        Column("tenant", String, nullable=False),
        Column("start", BigInteger, nullable=False),
        *_sum_columns(),
        PrimaryKeyConstraint("tenant", "start"),
    )


usage_hours = _rollup("usage_hours")
usage_days = _rollup("usage_days")

batches = Table(
    "batches",
    metadata,
    Column("id", String, primary_key=True),
    Column("consumer", String, nullable=False),
    Column("created_at", Float, nullable=False),
    # JSON: what the batch adds to Redis (running_totals.BatchEffects).
    Column("effects", Text, nullable=False),
)

schema_version = Table("schema_version", metadata, Column("version", Integer, nullable=False))

# Each entry brings the schema from its index to the next version; version 1 is
# the first release's tables. A new database is created at the last version by
# metadata.create_all, which declares every column these add. Append, never edit.
MIGRATIONS: list[str] = [
    # 2: line_items.adapter (issue #34); a partitioned table's partitions get it too.
    "ALTER TABLE line_items ADD COLUMN adapter VARCHAR NOT NULL DEFAULT ''",
]
VERSION = 1 + len(MIGRATIONS)

# Any fixed number: the advisory lock under which one replica creates the schema.
SCHEMA_LOCK = 7_370_001


async def create_schema(conn: AsyncConnection) -> int:
    """Create or upgrade the schema in the caller's transaction; the version it is at."""
    if conn.dialect.name == "postgresql":
        # Transaction-scoped: released by the commit that makes the tables visible.
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEMA_LOCK})
    await conn.run_sync(metadata.create_all)
    current = (await conn.execute(select(schema_version.c.version))).scalar()
    if current is None:
        # create_all has just made every table as the last version declares it.
        await conn.execute(schema_version.insert().values(version=VERSION))
        current = VERSION
    for statement in MIGRATIONS[current - 1 :]:
        await conn.execute(text(statement))
    if current != VERSION:
        await conn.execute(schema_version.update().values(version=VERSION))
    return VERSION
