"""The consumer's first pass and the upkeep's first round start the store at once
(billing/server.py runs both from the first second): on a fresh database both
must succeed, on SQLite (no advisory lock) as on PostgreSQL."""

import asyncio

from maas_services.billing.store.line_items import LineItemStore


async def test_starts_at_once_on_a_fresh_database_both_succeed(database_url):
    store = LineItemStore(database_url)
    try:
        await asyncio.gather(*(store.start() for _ in range(4)))
        assert await store.unapplied() == 0
    finally:
        await store.close()
