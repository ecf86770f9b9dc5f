"""`maas keys list`: every key of a tenant, or of all tenants, without a secret.

What Redis holds of a key (layout in services/gateway/admission/tenants.py) is its id,
tenant, status and creation time under the key's SHA-256; the listing shows
those and the tenant's limits, never the hash, which is what authentication
looks up. It reads only (SMEMBERS, GET, HGETALL), all the admin ACL user's.
"""

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from redis.asyncio import Redis

from maas_services.gateway.admission.tenants import Tenant, tenant_key


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    tenant: str
    status: str
    created: str  # UTC, ISO 8601 to the second
    rpm: int
    tpm: int
    max_concurrency: int
    max_tokens: int

    def to_json(self) -> dict:
        return asdict(self)


COLUMNS = tuple(KeyRecord.__dataclass_fields__)


async def list_keys(redis: Redis, tenants: list[Tenant]) -> list[KeyRecord]:
    """The keys of these tenants, by tenant then creation time: three round trips."""
    async with redis.pipeline(transaction=False) as pipe:
        for tenant in tenants:
            pipe.smembers(f"{tenant_key(tenant.name)}:keys")
        members = await pipe.execute()
    owned = [(t, key_id) for t, ids in zip(tenants, members, strict=True) for key_id in ids]
    async with redis.pipeline(transaction=False) as pipe:
        for _, key_id in owned:
            pipe.get(f"maas:keyid:{key_id}")
        digests = await pipe.execute()
    async with redis.pipeline(transaction=False) as pipe:
        for digest in digests:
            pipe.hgetall(f"maas:apikey:{digest}")
        # One record Redis cannot read (a wrong type) is listed as such, not fatal:
        # an operator lists keys precisely when something looks wrong.
        records = await pipe.execute(raise_on_error=False)
    # A key's three records are written in one transaction; one missing is skipped.
    found = [(t, key_id, r) for (t, key_id), r in zip(owned, records, strict=True) if r]
    found.sort(key=lambda each: (each[0].name, _created_at(each[2])))
    return [_key_record(tenant, key_id, record) for tenant, key_id, record in found]


def _created_at(record: dict[str, str] | Exception) -> float:
    return -1.0 if isinstance(record, Exception) else float(record["created_at"])


def _key_record(tenant: Tenant, key_id: str, record: dict[str, str] | Exception) -> KeyRecord:
    if isinstance(record, Exception):
        status, created = "unreadable", ""
    else:
        status = record["status"]
        stamp = datetime.fromtimestamp(float(record["created_at"]), UTC)
        created = stamp.isoformat(timespec="seconds")
    return KeyRecord(
        key_id=key_id,
        tenant=tenant.name,
        status=status,
        created=created,
        rpm=tenant.rpm,
        tpm=tenant.tpm,
        max_concurrency=tenant.max_concurrency,
        max_tokens=tenant.max_tokens,
    )
