"""`maas serve billing`."""

import asyncio
import os
import socket

from maas.v1 import billing_pb2, billing_pb2_grpc
from maas_services.billing.consumer import UsageConsumer
from maas_services.billing.health import ConsumerHealth, publish_health
from maas_services.billing.retention import StreamTrimmer
from maas_services.billing.servicer import BillingServicer
from maas_services.billing.settings import BillingSettings
from maas_services.billing.store.line_items import LineItemStore
from maas_services.billing.upkeep import Upkeep
from maas_services.common import event_loop
from maas_services.common.grpc_server import GrpcService, run_until_signalled, start_server
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM

SERVICE_NAME = billing_pb2.DESCRIPTOR.services_by_name["Billing"].full_name


async def serve(settings: BillingSettings) -> None:
    redis = open_redis(settings.redis_url)
    # Opening connects to nothing: a database that is down fails passes, not the start.
    store = LineItemStore(settings.billing_database_url)
    consumer = UsageConsumer(
        redis,
        settings.consumer_group,
        settings.consumer_name or f"{socket.gethostname()}-{os.getpid()}",
        settings.batch_size,
        settings.block_ms,
        prices=PriceTable.load(settings.prices_file),
        claim_idle_ms=settings.claim_idle_ms,
        tenant_labels=settings.metrics_tenants,
        retention=settings.retention(),
        health=ConsumerHealth(
            settings.unready_after_seconds, settings.max_lag_seconds, settings.stuck_after_seconds
        ),
        store=store,
    )
    # No ensure_group here: run() does it under supervision, so billing starts
    # (live, not ready) while Redis is down instead of crash-looping.
    consuming = asyncio.create_task(consumer.run())
    trimming = asyncio.create_task(
        StreamTrimmer(redis, USAGE_STREAM, settings.trim_interval_seconds).run()
    )
    upkeep = asyncio.create_task(Upkeep(consumer.ledger, settings.upkeep_interval_seconds).run())
    handle = await start_server(
        "billing",
        settings,
        [
            GrpcService(
                SERVICE_NAME,
                BillingServicer(consumer.ledger),
                billing_pb2_grpc.add_BillingServicer_to_server,
            )
        ],
    )
    publishing = asyncio.create_task(publish_health(handle, consumer.health, interval=1.0))

    async def stop_consuming() -> None:
        # Cancelling anywhere is safe: what was committed but not acked is
        # redelivered (inserting nothing) and its outbox row applied (ledger.py).
        chores = [consuming, trimming, upkeep, publishing]
        for chore in chores:
            chore.cancel()
        # Ended here, not by asyncio.run's last cancellation of what is left: a chore
        # cancelled inside a transaction terminates its connection as it unwinds
        # (SQLAlchemy's shielded graceful close, then aiosqlite's stop). Cancelled a second
        # time midway, it stopped the connection's thread before the graceful close's own
        # stop was served, and that task waited forever, asyncio.run and the process with
        # it (a CI run's orphan, session 21).
        await asyncio.wait(chores, timeout=settings.shutdown_grace_seconds)
        # The publisher may have run since shutdown began; draining stays unready.
        await handle.set_serving(False)

    await run_until_signalled(handle, settings.shutdown_grace_seconds, on_stop=stop_consuming)
    await redis.aclose()
    await store.close()


def main(settings: BillingSettings) -> None:
    event_loop.run(serve(settings))
