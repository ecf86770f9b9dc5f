"""open_engine on SQLite: replicas opening one new database file together."""

import asyncio

from sqlalchemy import text

from maas_services.common.sql_engine import open_engine


async def _first_write(url: str) -> None:
    engine = open_engine(url, connect_seconds=5, command_seconds=10)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            await conn.execute(text("INSERT INTO t VALUES (1)"))
    finally:
        await engine.dispose()


async def test_replicas_opening_a_new_file_together_all_succeed(tmp_path):
    # Each new file's switch to WAL races its first connections; before the
    # retry one start in about thirteen failed "database is locked".
    for attempt in range(25):
        url = f"sqlite:///{tmp_path}/db{attempt}.sqlite"
        await asyncio.gather(*(_first_write(url) for _ in range(4)))
        engine = open_engine(url, connect_seconds=5, command_seconds=10)
        async with engine.connect() as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 4
        await engine.dispose()
