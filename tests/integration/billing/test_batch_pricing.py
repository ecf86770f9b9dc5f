"""A batch line is billed at its model's batch price (half the interactive price
unless the table says), and a line whose event comes twice (a worker that died
after billing it, and the worker that ran it again) is billed once."""

import time
import uuid
from decimal import Decimal

from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.usage_event import UsageEvent

# Its fixtures (redis, billing) and helpers: the consumer and Billing service on loopback.
from tests.integration.billing.test_alias_pricing import (  # noqa: F401
    COMPLETION,
    PROMPT,
    bill,
    billing,
    line_items,
    redis,
)

MODEL = "smollm2-135m-instruct"


def event(tenant: str, request_id: str, batch_id: str = "", started_at: float | None = None):
    return UsageEvent(
        request_id=request_id,
        tenant=tenant,
        model=MODEL,
        deployment=MODEL,
        prompt_tokens=PROMPT,
        completion_tokens=COMPLETION,
        started_at=started_at or time.time(),
        batch_id=batch_id,
    )


async def test_batch_lines_cost_the_batch_price_and_are_billed_once(redis, billing):  # noqa: F811
    prices = PriceTable(
        models={
            MODEL: ModelPrice(input=Decimal("0.2"), output=Decimal("0.4")),
            "priced": ModelPrice(
                input=Decimal("0.2"),
                output=Decimal("0.4"),
                batch={"input": Decimal("0.05"), "output": Decimal("0.1")},
            ),
        }
    )
    group, consumer, stub = await billing(prices)
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    started = time.time()
    # Event ids are global (billing's dedup key): a batch id of this test's own.
    batch = f"batch_{uuid.uuid4().hex}"
    line = event(tenant, f"{batch}:1", batch, started)
    events = [
        event(tenant, f"chatcmpl-{batch}"),
        line,
        # The same line again, from the worker that ran it after another died.
        line.model_copy(update={"duration_seconds": 2.0}),
        event(tenant, f"{batch}:2", batch).model_copy(update={"deployment": "priced"}),
    ]
    await bill(redis, group, consumer, events)

    items = {i.request_id.removeprefix(batch): i for i in await line_items(stub, tenant)}
    assert sorted(items) == [":1", ":2", f"chatcmpl-{batch}"]
    interactive = prices.models[MODEL].cost_nano_usd(PROMPT, 0, COMPLETION)
    assert items[f"chatcmpl-{batch}"].cost_nano_usd == interactive
    assert items[":1"].cost_nano_usd == interactive // 2
    assert items[":2"].cost_nano_usd == ModelPrice(
        input=Decimal("0.05"), output=Decimal("0.1")
    ).cost_nano_usd(PROMPT, 0, COMPLETION)


def test_the_published_table_carries_the_batch_column():
    table = PriceTable(
        models={MODEL: ModelPrice(input=Decimal("1"), batch={"input": Decimal("0.3")})}
    )
    again = PriceTable.model_validate_json(table.model_dump_json())
    assert again.models[MODEL].for_batch().input == Decimal("0.3")
    assert ModelPrice(input=Decimal("1"), output=Decimal("3")).for_batch() == ModelPrice(
        input=Decimal("0.5"), output=Decimal("1.5")
    )
