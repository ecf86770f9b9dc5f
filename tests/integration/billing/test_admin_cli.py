"""`maas billing line-items|usage|reconcile` read the database the consumer writes."""

import asyncio
import csv
import io
import json
import time
import uuid

import pytest

from maas_services.billing.consumer import UsageConsumer
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.admin.billing import main
from tests.integration.billing.stopping import stopped

PRICES = PriceTable(models={"m": ModelPrice(input="1", output="2")})


@pytest.fixture
async def redis(redis_url):
    client = open_redis(redis_url)
    yield client
    await client.aclose()


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    # What was printed before (the consumer's log of a partition it created for
    # yesterday's events, past midnight UTC) is not the command's output.
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def bill(redis, store, events: list[UsageEvent]) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    await redis.xgroup_create(USAGE_STREAM, group, id="$", mkstream=True)
    consumer = UsageConsumer(redis, group, "c0", batch=50, block_ms=50, prices=PRICES, store=store)
    for e in events:
        await redis.xadd(USAGE_STREAM, e.to_fields())
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(30):
            while (await consumer.ledger.totals(events[0].tenant))[0].requests < len(events):
                await asyncio.sleep(0.05)
    finally:
        await stopped(task)
        await asyncio.gather(task, return_exceptions=True)


async def test_line_items_usage_and_reconcile_from_the_cli(
    redis, store, redis_url, database_url, capsys
):
    tenant = f"cli-{uuid.uuid4().hex[:6]}"
    now = time.time()
    events = [
        UsageEvent(
            request_id=f"chatcmpl-{i}-{tenant}",
            tenant=tenant,
            model="m",
            prompt_tokens=10 * (i + 1),
            completion_tokens=i,
            finish_reason="client_disconnect" if i == 2 else "stop",
            started_at=now - 3600 * (3 - i),
        )
        for i in range(3)
    ]
    await bill(redis, store, events)
    where = ["--redis-url", redis_url, "--database-url", database_url]
    code, out, err = await asyncio.to_thread(cli, capsys, *where, "line-items", "--tenant", tenant)
    assert code == 0, err
    items = json.loads(out)
    assert [i["request_id"] for i in items] == [e.request_id for e in events]
    assert items[2]["finish_reason"] == "client_disconnect"
    assert items[0]["cost_nano_usd"] == 10 * 1000
    # A time range, as CSV.
    code, out, err = await asyncio.to_thread(
        cli, capsys, *where, "line-items", "--tenant", tenant,
        "--from", str(int(now - 2.5 * 3600)), "--format", "csv",
    )  # fmt: skip
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["request_id"] for r in rows] == [e.request_id for e in events[1:]]
    code, out, err = await asyncio.to_thread(
        cli, capsys, *where, "usage", "--tenant", tenant, "--granularity", "hour",
        "--start", str(int(now - 4 * 3600)),
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert sum(b["requests"] for b in report["buckets"]) == report["requests"] == 3
    code, out, err = await asyncio.to_thread(
        cli, capsys, *where, "--state-dir", "/nonexistent", "reconcile",
        "--from", str(int(now - 4 * 3600)),
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["ledger_check"]["match"] and report["match"], report


def test_a_missing_database_is_a_clear_error(capsys, tmp_path):
    code, _, err = cli(capsys, "--state-dir", str(tmp_path), "line-items", "--tenant", "t")
    assert code == 1 and "no billing database" in err
