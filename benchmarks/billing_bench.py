"""Billing ingest: events/s one consumer commits, and the lag to the ledger.

Starts a private redis-server and a private PostgreSQL (or a SQLite file with
--database sqlite), preloads N usage events, then times one UsageConsumer (one
process) committing them in batches of --batch; a second phase sends events
one at a time and measures XADD-to-ledger lag. `make bench-billing`.
"""

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.machine import cpu_model
from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.store.line_items import LineItemStore
from maas_services.common.prices import ModelPrice, PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from tests.postgres import PostgresServer


def event(tenant: str) -> UsageEvent:
    return UsageEvent(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        model="m",
        prompt_tokens=300,
        completion_tokens=120,
        started_at=time.time(),
    )


async def run(events: int, lag_samples: int, database: str, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        postgres = None
        if database == "postgresql":
            postgres = PostgresServer(fsync=True)
            postgres.start()
            store = LineItemStore(postgres.url())
        else:
            store = LineItemStore(f"sqlite:///{tmp}/billing.db")
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
                redis, "billing", "bench", batch=batch, block_ms=50, prices=prices, store=store
            )
            await consumer.ensure_group()
            await store.start()
            started, cpu = time.perf_counter(), time.process_time()
            database_cpu = postgres.cpu_seconds() if postgres else 0.0
            task = asyncio.create_task(consumer.run())
            while (await redis.xpending(USAGE_STREAM, "billing"))["pending"] or (
                (await redis.xinfo_groups(USAGE_STREAM))[0]["last-delivered-id"]
                != (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]
            ):
                await asyncio.sleep(0.01)
            rate = events / (time.perf_counter() - started)
            # This process is the consumer (and the poll above, a little).
            cpu = time.process_time() - cpu
            database_cpu = (postgres.cpu_seconds() if postgres else 0.0) - database_cpu
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
            await store.close()
            server.stop(10)
            if postgres:
                postgres.remove()
    lags.sort()
    return {
        "benchmark": "billing_ingest",
        "command": "make bench-billing",
        "events": events,
        "database": database,
        "batch": batch,
        "cpu": cpu_model(),
        "events_per_s": round(rate, 1),
        # What the rate would be with a core to itself: CPU is the bottleneck
        # on a shared 2-core machine.
        "billing_cpu_seconds": round(cpu, 2),
        "events_per_billing_cpu_second": round(events / cpu),
        "database_cpu_seconds": round(database_cpu, 2),
        "events_per_cpu_second_billing_and_database": round(events / (cpu + database_cpu)),
        "load_average": os.getloadavg(),
        "lag_p50_ms": round(statistics.median(lags) * 1000, 2),
        "lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--lag-samples", type=int, default=200)
    parser.add_argument("--database", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/billing.json"))
    args = parser.parse_args()
    result = asyncio.run(run(args.events, args.lag_samples, args.database, args.batch))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
