"""Billing's fixtures: a real PostgreSQL beside the session's Redis, and a
database per test on each of the two backends billing supports. Every test
that bills through `store` ends with reconcile's ledger check (no difference
between line items, rollups and Redis's running totals)."""

import json
import time
import uuid

import pytest

from maas_services.billing.ledger import DAY
from maas_services.billing.running_totals import RunningTotals
from maas_services.billing.store.line_items import LineItemStore
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM
from maas_tools.admin.billing import reconcile_ledger
from tests.postgres import running_postgres


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session; skipped where none can start, unless
    MAAS_REQUIRE_POSTGRES=1 (CI), where that fails the tests instead."""
    yield from running_postgres()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    """A fresh, empty billing database: a SQLite file, or a database of its own
    on the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'billing.db'}"
    server = request.getfixturevalue("postgres")
    return server.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def store(request, database_url):
    """The test's database, started; reconciled against the test's Redis at the end
    (its `redis` fixture, else the session's)."""
    opened = LineItemStore(database_url)
    await opened.start()
    began = time.time()
    yield opened
    try:
        if "redis" in request.fixturenames:
            await assert_reconciled(request.getfixturevalue("redis"), opened, began)
        else:
            redis = open_redis(request.getfixturevalue("redis_url"))
            try:
                await assert_reconciled(redis, opened, began)
            finally:
                await redis.aclose()
    finally:
        await opened.close()


async def assert_reconciled(redis, store: LineItemStore, since: float = 0.0) -> None:
    """`maas billing reconcile`'s ledger check over all time finds no difference:
    line items = hourly rollups, and Redis's running totals = the daily rollups
    for the tenants first billed since `since`. (A test's fresh consumer group
    re-reads what earlier tests left on the session's stream into its own
    database, while Redis's totals for those tenants count every group's reading:
    only the test's own tenants can match.)"""
    # As billing's upkeep loop would: a consumer cancelled between its Redis
    # script and deleting its outbox row leaves one (harmless, Redis has it).
    totals = RunningTotals(redis, USAGE_STREAM, "reconcile")
    await store.claim_unapplied(0, lambda batch, change: totals.apply(batch, change, []))
    tenants = await store.tenants_first_billed_since(since)
    report = await reconcile_ledger(redis, store, 0, int(time.time()) + 2 * DAY, tenants)
    assert report["match"], json.dumps(report, indent=1)
    assert report["unapplied_batches"] == 0, json.dumps(report, indent=1)
