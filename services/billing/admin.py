"""`maas billing usage` and `maas billing reconcile`: the ledger for operators.

Both read Redis directly with the billing service's own Ledger code, so they
work while billing is down. Redis is found like every admin command does
(--redis-url, MAAS_REDIS_URL, or the local stack in .maas/).
"""

import argparse
import asyncio
import csv
import io
import json
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import RedisError

from maas_services.billing.ledger import DAY, HOUR, PREFIX, Ledger, Totals
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
    report = {
        "tenant": args.tenant,
        **totals_dict(totals),
        "models": {m: totals_dict(t) for m, t in models.items()},
    }
    if args.granularity:
        size = HOUR if args.granularity == "hour" else DAY
        buckets = await ledger.buckets(args.tenant, args.start, args.end, size)
        report["buckets"] = [
            {"start": datetime.fromtimestamp(s, UTC).isoformat(), **totals_dict(t)}
            for s, t in buckets
        ]
    return report


def usage_csv(report: dict) -> str:
    out = io.StringIO()
    rows = report.get("buckets") or [{"model": m, **t} for m, t in report["models"].items()]
    first = "start" if report.get("buckets") else "model"
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


async def reconcile(redis, args: argparse.Namespace) -> dict:
    urls = args.engine_metrics or _stack_engine_metrics(args.state_dir)
    ledger = await ledger_grand_total(redis)
    engines = engine_counters(urls)
    pending = (await redis.xlen(USAGE_STREAM)) if await redis.exists(USAGE_STREAM) else 0
    report = {
        "ledger": {
            "prompt_tokens": ledger.prompt_tokens,
            "completion_tokens": ledger.completion_tokens,
        },
        "engines": {k: int(v) for k, v in engines.items()},
        "stream_length": pending,
        "engine_metrics": urls,
    }
    report["difference"] = {k: report["engines"][k] - report["ledger"][k] for k in engines}
    report["match"] = not any(report["difference"].values())
    return report


def _stack_engine_metrics(state_dir: str | None) -> list[str]:
    path = Path(state_dir or ".maas") / "stack.json"
    try:
        metrics = json.loads(path.read_text())["metrics"]
    except (OSError, ValueError, KeyError):
        raise RedisNotFoundError(
            f"no engine metrics: pass --engine-metrics URL... or run a local stack ({path})"
        ) from None
    return [url for name, url in sorted(metrics.items()) if name.startswith("engine")]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maas billing", description=__doc__)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--state-dir", default=None)
    sub = parser.add_subparsers(dest="action", required=True)
    use = sub.add_parser("usage", help="a tenant's usage and charges")
    use.add_argument("--tenant", required=True)
    use.add_argument("--format", choices=["json", "csv"], default="json")
    use.add_argument("--granularity", choices=["hour", "day"], default=None)
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
    rec = sub.add_parser("reconcile", help="ledger totals vs the engines' token counters")
    rec.add_argument("--engine-metrics", nargs="*", default=None, help="engine /metrics URLs")
    return parser


async def _main(args: argparse.Namespace) -> str:
    redis = open_redis(locate_redis(args.redis_url, args.state_dir))
    try:
        if args.action == "reconcile":
            return json.dumps(await reconcile(redis, args), indent=2)
        quotas = Quotas(redis)
        if args.action == "quota":
            await quotas.set_monthly_budget(args.tenant, args.monthly_tokens)
            return json.dumps(quota_dict(await quotas.state(args.tenant)), indent=2)
        if args.action == "topup":
            if args.usd <= 0:
                raise ValueError("--usd must be positive")
            await quotas.top_up(args.tenant, int(args.usd * Decimal(10**9)))
            return json.dumps(quota_dict(await quotas.state(args.tenant)), indent=2)
        if args.end is None:
            args.end = int(datetime.now(UTC).timestamp()) + 1
        report = await usage(Ledger(redis, USAGE_STREAM, "billing", PriceTable()), args)
        report["quota"] = quota_dict(await quotas.state(args.tenant))
        return usage_csv(report) if args.format == "csv" else json.dumps(report, indent=2)
    finally:
        await redis.aclose()


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        print(asyncio.run(_main(args)))
    except (RedisNotFoundError, RedisError, httpx.HTTPError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
