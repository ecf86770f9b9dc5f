"""The response store on a real SQLite file and a real PostgreSQL: bounds per tenant,
eviction order, expiry, concurrent writers (two replicas on one database), and that
one tenant's flood leaves another's rows alone."""

import asyncio
import uuid

import pytest

from maas_services.gateway.responses.store import ResponseStore, StoreLimits
from tests.postgres import running_postgres


@pytest.fixture(scope="module")
def postgres():
    """billing's PostgreSQL server (tests/integration/billing/postgres.py), for this module."""
    yield from running_postgres()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """A fresh database: a SQLite file, or a database of its own on the PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/responses.db"
    return request.getfixturevalue("postgres").create_database(f"r_{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def open_store(database_url):
    stores = []

    async def make(**limits) -> ResponseStore:
        store = await ResponseStore.open(database_url, StoreLimits(**limits))
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


def body(response_id: str, pad: int = 0) -> dict:
    return {"id": response_id, "object": "response", "pad": "p" * pad}


async def test_a_stored_response_comes_back_for_its_tenant_only(open_store):
    store = await open_store()
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert await store.put("a", "resp_1", body("resp_1"), conversation)
    found = await store.get("a", "resp_1")
    assert found.body == body("resp_1")
    assert found.conversation == conversation
    assert await store.get("b", "resp_1") is None
    assert not await store.delete("b", "resp_1")
    assert await store.delete("a", "resp_1")
    assert await store.get("a", "resp_1") is None


async def test_the_count_bound_evicts_the_tenants_oldest(open_store):
    store = await open_store(max_per_tenant=3)
    for i in range(5):
        await store.put("a", f"resp_{i}", body(f"resp_{i}"), [])
    await store.put("b", "resp_b", body("resp_b"), [])
    kept = [i for i in range(5) if await store.get("a", f"resp_{i}") is not None]
    assert kept == [2, 3, 4]
    assert (await store.usage("a"))[0] == 3
    assert await store.get("b", "resp_b") is not None


async def test_the_byte_bound_evicts_as_many_as_needed(open_store):
    store = await open_store(max_bytes_per_tenant=10_000)
    for i in range(4):
        await store.put("a", f"small_{i}", body(f"small_{i}", 1000), [])
    # One row of ~7 KB needs three of the four ~1 KB rows gone (4 KB + 7 KB > 10 KB).
    await store.put("a", "big", body("big", 7000), [])
    count, size = await store.usage("a")
    assert size <= 10_000
    assert await store.get("a", "big") is not None
    assert await store.get("a", "small_3") is not None
    assert await store.get("a", "small_0") is None
    assert count == 3


async def test_a_row_over_the_whole_bound_is_refused_and_evicts_nothing(open_store):
    store = await open_store(max_bytes_per_tenant=2000)
    await store.put("a", "kept", body("kept"), [])
    assert not await store.put("a", "huge", body("huge", 5000), [])
    assert await store.get("a", "huge") is None
    assert await store.get("a", "kept") is not None


async def test_expired_rows_are_invisible_and_removed_by_the_next_write(open_store):
    store = await open_store(ttl_seconds=1e-6)
    await store.put("a", "old", body("old"), [])
    await asyncio.sleep(0.01)
    assert await store.get("a", "old") is None
    assert not await store.delete("a", "old")
    await store.put("b", "new", body("new"), [])
    assert (await store.usage("a"))[0] == 0


async def test_concurrent_writers_of_one_tenant_stay_within_the_bound(database_url):
    # Two stores on one database: two gateway replicas sharing it.
    limits = StoreLimits(max_per_tenant=10, max_bytes_per_tenant=20_000)
    # Started together: both create the table if missing, neither fails.
    replicas = await asyncio.gather(*(ResponseStore.open(database_url, limits) for _ in range(2)))
    try:
        await replicas[0].put("victim", "theirs", body("theirs"), [])
        await asyncio.gather(
            *(
                replicas[i % 2].put("flood", f"resp_{i}", body(f"resp_{i}", 500), [])
                for i in range(60)
            )
        )
        count, size = await replicas[1].usage("flood")
        assert count <= 10
        assert size <= 20_000
        assert await replicas[1].get("victim", "theirs") is not None
    finally:
        for store in replicas:
            await store.close()
