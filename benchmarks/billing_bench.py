"""Billing ingest: events/s one consumer commits, and the lag to the ledger.

Starts a private redis-server, preloads N usage events, then times one
UsageConsumer (one process, one core) committing them; a second phase sends
events one at a time and measures XADD-to-ledger lag. `make bench-billing`.
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from maas_services.billing.consumer import UsageConsumer
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process


def event(tenant: str) -> UsageEvent:
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="m",
        prompt_tokens=300,
        completion_tokens=120,
        started_at=time.time(),
    )


async def run(events: int, lag_samples: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = redis_process(Path(tmp), port)
        server.start()
        url = f"redis://127.0.0.1:{port}/0"
        await wait_ready(server, url, 30)
        redis = open_redis(url)
        prices = PriceTable(models={"m": ModelPrice(input="0.1", output="0.3")})
        try:
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(events):
                    pipe.xadd(USAGE_STREAM, event(f"t{i % 50}").to_fields())
                await pipe.execute()
            consumer = UsageConsumer(
                redis, "billing", "bench", batch=200, block_ms=50, prices=prices
            )
            await consumer.ensure_group()
            started = time.perf_counter()
            task = asyncio.create_task(consumer.run())
            while (await redis.xpending(USAGE_STREAM, "billing"))["pending"] or (
                (await redis.xinfo_groups(USAGE_STREAM))[0]["last-delivered-id"]
                != (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]
            ):
                await asyncio.sleep(0.01)
            rate = events / (time.perf_counter() - started)
            lags = []
            for _ in range(lag_samples):
                e = event("lag")
                sent = time.perf_counter()
                before = (await consumer.ledger.totals("lag"))[0].requests
                await redis.xadd(USAGE_STREAM, e.to_fields())
                while (await consumer.ledger.totals("lag"))[0].requests == before:
                    await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - sent)
            task.cancel()
        finally:
            await redis.aclose()
            server.stop(10)
    lags.sort()
    return {
        "benchmark": "billing_ingest",
        "command": "make bench-billing",
        "events": events,
        "events_per_s": round(rate, 1),
        "lag_p50_ms": round(statistics.median(lags) * 1000, 2),
        "lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--lag-samples", type=int, default=200)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/billing.json"))
    args = parser.parse_args()
    result = asyncio.run(run(args.events, args.lag_samples))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
