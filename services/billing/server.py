"""`maas serve billing`."""

import asyncio
import os
import socket

from maas.v1 import billing_pb2, billing_pb2_grpc
from services.billing.consumer import UsageConsumer
from services.billing.prices import PriceTable
from services.billing.retention import StreamTrimmer
from services.billing.servicer import BillingServicer
from services.billing.settings import BillingSettings
from services.common.grpc_server import GrpcService, run_until_signalled, start_server
from services.common.redis_client import open_redis
from services.common.usage_event import USAGE_STREAM

SERVICE_NAME = billing_pb2.DESCRIPTOR.services_by_name["Billing"].full_name


async def serve(settings: BillingSettings) -> None:
    redis = open_redis(settings.redis_url)
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
    )
    await consumer.ensure_group()
    consuming = asyncio.create_task(consumer.run())
    trimming = asyncio.create_task(
        StreamTrimmer(redis, USAGE_STREAM, settings.trim_interval_seconds).run()
    )
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

    async def stop_consuming() -> None:
        # Each entry commits atomically, so cancelling between entries is safe.
        consuming.cancel()
        trimming.cancel()

    await run_until_signalled(handle, settings.shutdown_grace_seconds, on_stop=stop_consuming)
    await redis.aclose()


def main(settings: BillingSettings) -> None:
    asyncio.run(serve(settings))
