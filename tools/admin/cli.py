"""`maas tenants ...` and `maas keys ...`: manage tenants and API keys in Redis.

    maas tenants create --name acme --rpm 600 --tpm 100000 --max-concurrency 8 --json
    maas tenants update --name acme --adapter-loads-per-minute 20
    maas tenants list | update --name acme --rpm 1200 | disable --name acme
    maas keys create --tenant acme
    maas keys list [--tenant acme]
    maas keys revoke --key-id key_0123456789ab

A new key is printed once and never again: Redis only keeps its hash, and
`keys list` shows neither (id, tenant, status, created, the tenant's limits).
"""

import argparse
import asyncio
import json
import sys

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.tenants import (
    Tenant,
    TenantExistsError,
    TenantNotFoundError,
    TenantStore,
)
from maas_tools.admin.key_listing import COLUMNS as KEY_COLUMNS
from maas_tools.admin.key_listing import list_keys
from maas_tools.admin.redis_locator import RedisNotFoundError, locate_redis

TENANT_COLUMNS = (
    "name",
    "tier",
    "status",
    "rpm",
    "tpm",
    "max_concurrency",
    "max_tokens",
    "adapter_loads_per_minute",
)


def _limit_flags(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """Flags shared by create and update; update leaves unset ones unchanged."""
    default = 0 if defaults else None
    parser.add_argument("--tier", default="standard" if defaults else None)
    parser.add_argument("--rpm", type=int, default=default, help="requests per minute (0: none)")
    parser.add_argument("--tpm", type=int, default=default, help="tokens per minute (0: none)")
    parser.add_argument("--max-concurrency", type=int, default=default)
    parser.add_argument("--max-tokens", type=int, default=default, help="cap per request")
    parser.add_argument(
        "--adapter-loads-per-minute",
        type=int,
        default=default,
        help="on-demand LoRA adapter loads per minute, across the gateway's replicas"
        " (0: the gateway's adapter_loads_per_minute)",
    )
    parser.add_argument(
        "--models", default="" if defaults else None, help="allowed models, comma-separated"
    )


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"maas {command}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON")
    common.add_argument("--redis-url", help="default: MAAS_REDIS_URL, else the local stack")
    common.add_argument("--state-dir", help="local stack state (default .maas)")
    sub = parser.add_subparsers(dest="action", required=True)
    if command == "tenants":
        create = sub.add_parser("create", parents=[common], help="new tenant and its first key")
        create.add_argument("--name", required=True)
        _limit_flags(create, defaults=True)
        sub.add_parser("list", parents=[common])
        update = sub.add_parser("update", parents=[common], help="change tier, limits, status")
        update.add_argument("--name", required=True)
        update.add_argument("--status", choices=["active", "disabled"])
        _limit_flags(update, defaults=False)
        disable = sub.add_parser("disable", parents=[common], help="refuse all its keys")
        disable.add_argument("--name", required=True)
    else:
        create = sub.add_parser("create", parents=[common], help="new key for a tenant")
        create.add_argument("--tenant", required=True)
        listing = sub.add_parser(
            "list", parents=[common], help="keys and their tenant's limits, no secrets"
        )
        listing.add_argument("--tenant", help="only this tenant's keys (default: every tenant)")
        revoke = sub.add_parser("revoke", parents=[common])
        revoke.add_argument("--key-id", required=True)
    return parser


def _tenant_fields(args: argparse.Namespace) -> dict:
    fields = {
        "tier": args.tier,
        "rpm": args.rpm,
        "tpm": args.tpm,
        "max_concurrency": args.max_concurrency,
        "max_tokens": args.max_tokens,
        "adapter_loads_per_minute": args.adapter_loads_per_minute,
        "allowed_models": args.models,
        "status": getattr(args, "status", None),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _tenant_json(tenant: Tenant) -> dict:
    return tenant.model_dump(mode="json")


async def _tenants(store: TenantStore, name: str | None) -> list[Tenant]:
    """The named tenant, or every tenant when no name is given."""
    if name is None:
        return await store.list_tenants()
    tenant = await store.get_tenant(name)
    if tenant is None:
        raise TenantNotFoundError(f"tenant {name!r} does not exist")
    return [tenant]


async def _run(command: str, args: argparse.Namespace, redis: Redis) -> dict | list:
    store = TenantStore(redis)
    if command == "keys":
        if args.action == "create":
            key_id, api_key = await store.create_key(args.tenant)
            return {"tenant": args.tenant, "key_id": key_id, "api_key": api_key}
        if args.action == "list":
            keys = await list_keys(redis, await _tenants(store, args.tenant))
            return [key.to_json() for key in keys]
        if not await store.revoke_key(args.key_id):
            raise TenantNotFoundError(f"no key with id {args.key_id!r}")
        return {"key_id": args.key_id, "status": "revoked"}
    if args.action == "create":
        fields = _tenant_fields(args)
        tenant = await store.create_tenant(args.name, fields.pop("tier"), **fields)
        key_id, api_key = await store.create_key(tenant.name)
        return {"tenant": _tenant_json(tenant), "key_id": key_id, "api_key": api_key}
    if args.action == "list":
        return [_tenant_json(t) for t in await store.list_tenants()]
    if args.action == "update":
        return _tenant_json(await store.update_tenant(args.name, **_tenant_fields(args)))
    return _tenant_json(await store.disable_tenant(args.name))


def _table(rows: list[dict], columns: tuple[str, ...]) -> str:
    # At least 15 wide, wider where a value is (a key id, a timestamp), so columns align.
    widths = [max([15, len(c)] + [len(str(row[c])) for row in rows]) for c in columns]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(columns, widths, strict=True))]
    lines += [
        "  ".join(f"{row[c]!s:<{w}}" for c, w in zip(columns, widths, strict=True)) for row in rows
    ]
    return "\n".join(lines)


def _text(result: dict | list, columns: tuple[str, ...]) -> str:
    if isinstance(result, list):
        return _table(result, columns)
    lines = []
    tenant = result.get("tenant") if isinstance(result.get("tenant"), dict) else None
    if tenant is not None or "tier" in result:
        lines.append(_table([tenant or result], TENANT_COLUMNS))
    if "api_key" in result:
        lines.append(f"key {result['key_id']} (shown once): {result['api_key']}")
    if result.get("status") == "revoked":
        lines.append(f"key {result['key_id']} revoked")
    return "\n".join(lines)


async def _main(command: str, args: argparse.Namespace) -> dict | list:
    redis = open_redis(locate_redis(args.redis_url, args.state_dir))
    try:
        return await _run(command, args, redis)
    finally:
        await redis.aclose()


def main(command: str, argv: list[str]) -> int:
    args = _parser(command).parse_args(argv)
    try:
        result = asyncio.run(_main(command, args))
    except (RedisNotFoundError, TenantExistsError, TenantNotFoundError) as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 1
    except ValidationError as exc:
        print(
            f"error: invalid value: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}",
            file=sys.stderr,
        )
        return 2
    except RedisError as exc:
        print(f"error: Redis: {exc}", file=sys.stderr)
        return 1
    columns = KEY_COLUMNS if command == "keys" else TENANT_COLUMNS
    print(json.dumps(result, indent=2) if args.json else _text(result, columns))
    return 0
