"""An async SQLAlchemy engine for a database URL, the same way for every service.

Billing's line items and the gateway's stored responses each live in a
relational database: PostgreSQL where several replicas share it, an SQLite
file for `maas up` (and the tests). A plain `postgresql://` or `sqlite:///`
URL gets its async driver (asyncpg, aiosqlite); a URL naming its driver is
kept. SQLite runs in WAL mode with a 30 s busy timeout, so readers never wait
for the writer and a writer waits for another instead of failing;
`:memory:` keeps one connection (each would otherwise be a database of its
own). A PostgreSQL server that does not answer fails a call within the
caller's timeouts instead of hanging it.
"""

import sqlite3
import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

SQLITE_BUSY_SECONDS = 30.0
ASYNC_DRIVERS = {"postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}


def async_url(url: str) -> str:
    parsed = make_url(url)
    if parsed.drivername in ASYNC_DRIVERS:
        parsed = parsed.set(drivername=ASYNC_DRIVERS[parsed.drivername])
    return parsed.render_as_string(hide_password=False)


def open_engine(url: str, connect_seconds: float, command_seconds: float) -> AsyncEngine:
    url = async_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_async_engine(
            url,
            pool_size=4,
            pool_pre_ping=True,
            connect_args={"timeout": connect_seconds, "command_timeout": command_seconds},
        )
    path = parsed.database
    busy = {"timeout": SQLITE_BUSY_SECONDS}
    if not path or path == ":memory:":
        engine = create_async_engine(url, poolclass=StaticPool, connect_args=busy)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args=busy)

    @event.listens_for(engine.sync_engine, "connect")
    def _wal(dbapi_connection, _record) -> None:
        _switch_to_wal(dbapi_connection)

    return engine


def _switch_to_wal(dbapi_connection) -> None:
    # Switching a new file to WAL needs its exclusive lock, and SQLite answers
    # "database is locked" at once (no busy wait, which could deadlock) while
    # another connection opening the same file holds a lock: replicas starting
    # together retry within the busy budget. WAL persists in the file, so only
    # a database's first connections ever race here.
    deadline = time.monotonic() + SQLITE_BUSY_SECONDS
    while True:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
        finally:
            cursor.close()
