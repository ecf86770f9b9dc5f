"""Requests run with a LoRA adapter: priced at the adapter's own price, else at its
base deployment's; the line items keep the adapter; the running totals and
`maas billing usage` group by it."""

import asyncio
import csv
import io
import json
import time
import uuid
from decimal import Decimal

from sqlalchemy import select, text

from maas_services.billing.store.line_items import LineItem, LineItemStore
from maas_services.billing.store.schema import VERSION, schema_version
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.usage_event import UsageEvent
from tests.integration.billing.test_admin_cli import cli
from tests.integration.billing.test_alias_pricing import bill, billing, redis  # noqa: F401

BASE = "smollm2"
PROMPT, COMPLETION = 1000, 100
PRICES = PriceTable(
    models={BASE: ModelPrice(input=Decimal(1), output=Decimal(2))},
    adapters={"priced": ModelPrice(input=Decimal(3), output=Decimal(4))},
)


def served(tenant: str, adapter: str) -> UsageEvent:
    """The gateway's event for a request naming `adapter` (or the base, for "")."""
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model=adapter or BASE,
        deployment=BASE,
        adapter=adapter,
        prompt_tokens=PROMPT,
        completion_tokens=COMPLETION,
        started_at=time.time(),
    )


def cost(price: ModelPrice) -> int:
    return price.cost_nano_usd(PROMPT, 0, COMPLETION)


def test_an_adapter_without_a_price_of_its_own_costs_its_bases():
    assert PRICES.for_served(BASE, "priced") == PRICES.adapters["priced"]
    assert PRICES.for_served(BASE, "unpriced") == PRICES.models[BASE]
    assert PRICES.for_served(BASE) == PRICES.models[BASE]


async def test_usage_by_adapter_from_line_items_to_the_cli(
    redis,  # noqa: F811
    billing,  # noqa: F811
    store,
    redis_url,
    database_url,
    capsys,
):
    group, consumer, _ = await billing(PRICES)
    tenant = f"lora-{uuid.uuid4().hex[:6]}"
    events = [served(tenant, a) for a in ("priced", "unpriced", "priced", "")]
    await bill(redis, group, consumer, events)

    items = await store.items(tenant, 0, time.time() + 60)
    by_request = {i["request_id"]: (i["adapter"], i["cost_nano_usd"]) for i in items}
    base, own = cost(PRICES.models[BASE]), cost(PRICES.adapters["priced"])
    assert [by_request[e.request_id] for e in events] == [
        ("priced", own),
        ("unpriced", base),
        ("priced", own),
        ("", base),
    ]
    adapters = await consumer.ledger.adapter_totals(tenant)
    assert {a: (t.requests, t.cost_nano_usd) for a, t in adapters.items()} == {
        "priced": (2, 2 * own),
        "unpriced": (1, base),
    }

    where = ["--redis-url", redis_url, "--database-url", database_url]
    code, out, err = await asyncio.to_thread(cli, capsys, *where, "usage", "--tenant", tenant)
    assert code == 0, err
    report = json.loads(out)
    assert {a: u["requests"] for a, u in report["adapters"].items()} == {
        "priced": 2,
        "unpriced": 1,
    }
    assert report["requests"] == 4
    code, out, err = await asyncio.to_thread(
        cli, capsys, *where, "usage", "--tenant", tenant, "--format", "csv", "--by", "adapter"
    )
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["adapter"], r["requests"]) for r in rows] == [("priced", "2"), ("unpriced", "1")]


async def test_a_version_1_database_gains_the_adapter_column(database_url):
    first = LineItemStore(database_url)
    await first.start()
    # Back to the first release's schema: no adapter column, version 1.
    async with first.engine.begin() as conn:
        await conn.execute(text("ALTER TABLE line_items DROP COLUMN adapter"))
        await conn.execute(schema_version.update().values(version=1))
    await first.close()

    upgraded = LineItemStore(database_url)
    try:
        await upgraded.start()
        now = time.time()
        item = LineItem("r1", "t", "k", "m", BASE, now, now + 1, 10, 0, 5, 7, "stop", "priced")
        await upgraded.commit("b1", "c", [item], lambda new: "{}")
        (row,) = await upgraded.items("t", 0, now + 60)
        assert row["adapter"] == "priced"
        async with upgraded.engine.connect() as conn:
            assert (await conn.execute(select(schema_version.c.version))).scalar() == VERSION
    finally:
        await upgraded.close()
