"""The SQL tables of files and batches, and opening the database that holds them.

They live in the gateway's records database (the stored responses' by
default): an SQLite file for `maas up`, PostgreSQL shared by every replica in
the chart, so any replica serves any file or batch and any replica's batch
worker can take over another's lines.
"""

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.schema import CreateIndex, CreateTable

from maas_services.common.sql_engine import open_engine

metadata = MetaData()

files = Table(
    "maas_files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(255), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("filename", String(255), nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    # Requests in a batch input file, and the url they all name ("" if mixed).
    Column("lines", Integer, nullable=False, default=0),
    Column("endpoint", String(64), nullable=False, default=""),
    Index("ix_maas_files_tenant_created", "tenant", "created_at"),
)

batches = Table(
    "maas_batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant", String(255), nullable=False),
    Column("key_id", String(255), nullable=False, default=""),
    Column("input_file_id", String(64), nullable=False),
    Column("endpoint", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    # Each status's time, as OpenAI's batch object carries them (JSON object).
    Column("times", Text, nullable=False, default="{}"),
    Column("metadata", Text, nullable=False, default="null"),
    Column("errors", Text, nullable=False, default="null"),
    Column("output_file_id", String(64)),
    Column("error_file_id", String(64)),
    Column("total", Integer, nullable=False, default=0),
    # Who finalizes it, until when (a finalizer killed midway is taken over).
    Column("owner", String(64), nullable=False, default=""),
    Column("lease_until", Float, nullable=False, default=0.0),
    Index("ix_maas_batches_tenant_created", "tenant", "created_at"),
    Index("ix_maas_batches_status", "status"),
)

lines = Table(
    "maas_batch_lines",
    metadata,
    Column("batch_id", String(64), nullable=False),
    Column("line", Integer, nullable=False),
    Column("custom_id", Text, nullable=False),
    # Where the request is in the input file.
    Column("offset", Integer, nullable=False),
    Column("length", Integer, nullable=False),
    # pending -> running (leased to owner until lease_until) -> done
    Column("state", String(8), nullable=False),
    Column("owner", String(64), nullable=False, default=""),
    Column("lease_until", Float, nullable=False, default=0.0),
    Column("attempts", Integer, nullable=False, default=0),
    # Set by the first claim and kept: the usage event's start, so a line run
    # again after a worker died is the same event to billing (same day).
    Column("started_at", Float),
    Column("ok", Boolean),
    # The output or error file's line for it, as JSON.
    Column("result", Text),
    PrimaryKeyConstraint("batch_id", "line"),
    Index("ix_maas_batch_lines_state", "state", "lease_until"),
)


async def open_records(url: str) -> AsyncEngine:
    """The database, with the tables created (replicas starting together included)."""
    engine = open_engine(url, connect_seconds=5, command_seconds=30)
    async with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('maas_batches'))"))
        for table in metadata.sorted_tables:
            await conn.execute(CreateTable(table, if_not_exists=True))
            for index in table.indexes:
                await conn.execute(CreateIndex(index, if_not_exists=True))
    return engine


async def lock_tenant(conn: AsyncConnection, scope: str, tenant: str) -> None:
    """PostgreSQL: serialize this transaction with every replica's for the tenant
    (SQLite has one writer already)."""
    if conn.dialect.name == "postgresql":
        await conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"{scope}:{tenant}"}
        )
