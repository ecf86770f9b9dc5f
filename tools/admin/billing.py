"""`maas billing usage|line-items|reconcile|quota|topup`: the ledger for operators.

`usage` gives a tenant's totals, per model (the name the client sent) and per
LoRA adapter (`adapters`; as CSV, `--by adapter`), and with --granularity its
hour or day buckets.

They read Redis and billing's database directly with the billing service's
own Ledger code, so they work while billing is down. Redis is found like every
admin command does (--redis-url, MAAS_REDIS_URL, or the local stack in
.maas/); the database by --database-url, then MAAS_BILLING_DATABASE_URL, then the
local stack's SQLite file (<state dir>/billing.db).

`reconcile --from --to` checks the ledger against itself and the engines:
the hourly totals recomputed from the line items against the hourly rollups
GetUsage answers from; each of those tenants' running totals in Redis against
the database's daily rollups (equal once the outbox is empty); and, where the
engines' /metrics are known, the ledger's token totals against the engines'
counters.
"""

import argparse
import asyncio
import csv
import io
import json
import os
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from maas_services.billing.ledger import DAY, HOUR, PREFIX, Ledger, Totals
from maas_services.billing.store.line_items import LineItemStore
from maas_services.common.billing_keys import tenant_key
from maas_services.common.prices import PriceTable
from maas_services.common.quota import Quotas, QuotaState
from maas_services.common.redis_client import open_redis
from maas_services.common.timestamps import parse_timestamp
from maas_services.common.usage_event import USAGE_STREAM
from maas_tools.admin.redis_locator import RedisNotFoundError, locate_redis


def totals_dict(totals: Totals) -> dict:
    return {
        "requests": totals.requests,
        "prompt_tokens": totals.prompt_tokens,
        "cached_prompt_tokens": totals.cached_prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "total_tokens": totals.total_tokens,
        "cost_usd": totals.cost_nano_usd / 1e9,
    }


async def usage(ledger: Ledger, args: argparse.Namespace) -> dict:
    totals, models = await ledger.totals(args.tenant)
    adapters = await ledger.adapter_totals(args.tenant)
    report = {
        "tenant": args.tenant,
        **totals_dict(totals),
        "models": {m: totals_dict(t) for m, t in models.items()},
        "adapters": {a: totals_dict(t) for a, t in adapters.items()},
    }
    if args.granularity:
        size = HOUR if args.granularity == "hour" else DAY
        buckets = await ledger.buckets(args.tenant, args.start, args.end, size)
        report["buckets"] = [
            {"start": datetime.fromtimestamp(s, UTC).isoformat(), **totals_dict(t)}
            for s, t in buckets
        ]
    return report


def usage_csv(report: dict, by: str = "model") -> str:
    """The buckets, or else the totals per model or per adapter (`by`), one row each."""
    out = io.StringIO()
    groups = report[f"{by}s"].items()
    rows = report.get("buckets") or [{by: name, **t} for name, t in groups]
    first = "start" if report.get("buckets") else by
    columns = [
        first,
        "requests",
        "prompt_tokens",
        "cached_prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "cost_usd",
    ]
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def quota_dict(state: QuotaState) -> dict:
    balance = state.balance_nano_usd
    return {
        "balance_usd": None if balance is None else balance / 1e9,
        "monthly_token_budget": state.monthly_token_budget,
        "tokens_this_month": state.tokens_this_month,
        "exhausted": state.exhausted,
    }


async def ledger_grand_total(redis) -> Totals:
    grand = Totals()
    async for key in redis.scan_iter(match=f"{PREFIX}tenant:*", count=500):
        if key.count(":") != 3:  # only the running-totals hash of each tenant
            continue
        t = Totals.from_hash(await redis.hgetall(key))
        for field in vars(grand):
            setattr(grand, field, getattr(grand, field) + getattr(t, field))
    return grand


def engine_counters(metrics_urls: list[str]) -> dict[str, float]:
    counters = {"prompt_tokens": 0.0, "completion_tokens": 0.0}
    names = {
        "maas_engine_prompt_tokens_total": "prompt_tokens",
        "maas_engine_generation_tokens_total": "completion_tokens",
    }
    for url in metrics_urls:
        text = httpx.get(url, timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names:
                    counters[names[sample.name]] += sample.value
    return counters


async def reconcile_ledger(
    redis, store: LineItemStore, start: int, end: int, tenants: list[str] | None = None
) -> dict:
    """The ledger against itself: line items vs hourly rollups for the hours in
    [start, end), and the running totals in Redis of `tenants` (default: every
    tenant billed since `start`) vs the daily rollups (all time). `match` when
    nothing differs."""
    start = start // HOUR * HOUR
    recomputed = await store.hours_from_items(start, end)
    rolled_up = await store.hours_rolled_up(start, end)
    hours = [
        {
            "tenant": tenant,
            "start": datetime.fromtimestamp(hour, UTC).isoformat(),
            "line_items": vars(recomputed.get((tenant, hour), Totals())),
            "rollup": vars(rolled_up.get((tenant, hour), Totals())),
        }
        for tenant, hour in sorted(recomputed.keys() | rolled_up.keys())
        if recomputed.get((tenant, hour)) != rolled_up.get((tenant, hour))
    ]
    if tenants is None:
        tenants = await store.tenants_since(start)
    database = await store.tenant_sums(tenants)
    async with redis.pipeline(transaction=False) as pipe:
        for tenant in tenants:
            pipe.hgetall(tenant_key(tenant))
        in_redis_all = await pipe.execute()
    running = []
    for tenant, raw in zip(tenants, in_redis_all, strict=True):
        in_redis = Totals.from_hash(raw)
        in_database = database.get(tenant, Totals())
        if in_redis != in_database:
            running.append(
                {"tenant": tenant, "redis": vars(in_redis), "database": vars(in_database)}
            )
    unapplied = await store.unapplied()
    return {
        "from": datetime.fromtimestamp(start, UTC).isoformat(),
        "to": datetime.fromtimestamp(end, UTC).isoformat(),
        "tenants": len(tenants),
        "hours_differing": hours,
        "running_totals_differing": running,
        # Committed batches Redis does not have yet: running totals lag by them.
        "unapplied_batches": unapplied,
        "match": not hours and not running,
    }


async def reconcile(redis, store: LineItemStore, args: argparse.Namespace) -> dict:
    report = {"ledger_check": await reconcile_ledger(redis, store, args.start, args.end)}
    urls = args.engine_metrics or _stack_engine_metrics(args.state_dir)
    ledger = await ledger_grand_total(redis)
    report["ledger"] = {
        "prompt_tokens": ledger.prompt_tokens,
        "completion_tokens": ledger.completion_tokens,
    }
    report["stream_length"] = (
        (await redis.xlen(USAGE_STREAM)) if await redis.exists(USAGE_STREAM) else 0
    )
    report["engine_metrics"] = urls
    report["match"] = report["ledger_check"]["match"]
    if urls:
        engines = engine_counters(urls)
        report["engines"] = {k: int(v) for k, v in engines.items()}
        report["difference"] = {k: report["engines"][k] - report["ledger"][k] for k in engines}
        report["match"] = report["match"] and not any(report["difference"].values())
    return report


def _stack_engine_metrics(state_dir: str | None) -> list[str]:
    """The local stack's engines' /metrics; none (and no engine check) without one."""
    path = Path(state_dir or ".maas") / "stack.json"
    try:
        metrics = json.loads(path.read_text())["metrics"]
    except (OSError, ValueError, KeyError):
        return []
    return [url for name, url in sorted(metrics.items()) if name.startswith("engine")]


def locate_database(flag: str | None, state_dir: str | None) -> str:
    if flag:
        return flag
    if os.environ.get("MAAS_BILLING_DATABASE_URL"):
        return os.environ["MAAS_BILLING_DATABASE_URL"]
    path = Path(state_dir or os.environ.get("MAAS_STATE_DIR", ".maas")) / "billing.db"
    if not path.exists():
        raise RedisNotFoundError(
            f"no billing database: {path} is missing and MAAS_BILLING_DATABASE_URL is not set; "
            "pass --database-url"
        )
    return f"sqlite:///{path.resolve()}"


async def line_items(store: LineItemStore, args: argparse.Namespace) -> list[dict]:
    return await store.items(args.tenant, args.start, args.end)


def line_items_csv(items: list[dict]) -> str:
    out = io.StringIO()
    columns = list(items[0]) if items else ["request_id"]
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    writer.writerows(items)
    return out.getvalue()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maas billing", description=__doc__)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--database-url", default=None, help="billing's database")
    sub = parser.add_subparsers(dest="action", required=True)
    use = sub.add_parser("usage", help="a tenant's usage and charges")
    use.add_argument("--tenant", required=True)
    use.add_argument("--format", choices=["json", "csv"], default="json")
    use.add_argument("--granularity", choices=["hour", "day"], default=None)
    use.add_argument(
        "--by", choices=["model", "adapter"], default="model", help="CSV rows per model or adapter"
    )
    use.add_argument("--start", type=parse_timestamp, default=0)
    use.add_argument("--end", type=parse_timestamp, default=None)
    quota = sub.add_parser("quota", help="set a tenant's monthly token budget")
    quota.add_argument("--tenant", required=True)
    quota.add_argument(
        "--monthly-tokens",
        type=int,
        default=None,
        help="tokens per calendar month (UTC); omit to remove the budget",
    )
    top = sub.add_parser("topup", help="add prepaid balance (makes the tenant prepaid)")
    top.add_argument("--tenant", required=True)
    top.add_argument("--usd", type=Decimal, required=True)
    items = sub.add_parser("line-items", help="a tenant's line items, from the database")
    items.add_argument("--tenant", required=True)
    items.add_argument("--format", choices=["json", "csv"], default="json")
    _time_range(items)
    rec = sub.add_parser(
        "reconcile", help="line items vs rollups vs Redis's running totals vs the engines"
    )
    rec.add_argument("--engine-metrics", nargs="*", default=None, help="engine /metrics URLs")
    _time_range(rec)
    return parser


def _time_range(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from", dest="start", type=parse_timestamp, default=0, help="Unix seconds or ISO 8601"
    )
    parser.add_argument("--to", dest="end", type=parse_timestamp, default=None)


async def _with_store(args: argparse.Namespace, work) -> str:
    store = LineItemStore(locate_database(args.database_url, args.state_dir))
    try:
        return await work(store)
    finally:
        await store.close()


async def _main(args: argparse.Namespace) -> str:
    if getattr(args, "end", 0) is None:
        args.end = int(datetime.now(UTC).timestamp()) + 1
    if args.action == "line-items":

        async def listed(store: LineItemStore) -> str:
            items = await line_items(store, args)
            return line_items_csv(items) if args.format == "csv" else json.dumps(items, indent=2)

        return await _with_store(args, listed)
    redis = open_redis(locate_redis(args.redis_url, args.state_dir))
    try:
        if args.action == "reconcile":

            async def checked(store: LineItemStore) -> str:
                return json.dumps(await reconcile(redis, store, args), indent=2)

            return await _with_store(args, checked)
        quotas = Quotas(redis)
        if args.action == "quota":
            await quotas.set_monthly_budget(args.tenant, args.monthly_tokens)
            return json.dumps(quota_dict(await quotas.state(args.tenant)), indent=2)
        if args.action == "topup":
            if args.usd <= 0:
                raise ValueError("--usd must be positive")
            await quotas.top_up(args.tenant, int(args.usd * Decimal(10**9)))
            return json.dumps(quota_dict(await quotas.state(args.tenant)), indent=2)

        async def used(store: LineItemStore) -> dict:
            ledger = Ledger(redis, USAGE_STREAM, "billing", PriceTable(), store=store)
            return await usage(ledger, args)

        if args.granularity:
            report = await _with_store(args, used)
        else:  # totals only: Redis has them, no database needed
            report = await usage(Ledger(redis, USAGE_STREAM, "billing", PriceTable()), args)
        report["quota"] = quota_dict(await quotas.state(args.tenant))
        if args.format == "csv":
            return usage_csv(report, args.by)
        return json.dumps(report, indent=2)
    finally:
        await redis.aclose()


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        print(asyncio.run(_main(args)))
    except (
        RedisNotFoundError,
        RedisError,
        SQLAlchemyError,
        OSError,
        httpx.HTTPError,
        ValueError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
