"""`maas keys list`: every key of a tenant, or of all tenants, without a secret.

What Redis holds of a key (layout in services/gateway/admission/tenants.py) is its id,
tenant, status and creation time under the key's SHA-256; the listing shows
those and the tenant's limits, never the hash, which is what authentication
looks up. It reads only (SMEMBERS, GET, HGETALL), all the admin ACL user's.
"""

from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from redis.asyncio import Redis

from services.gateway.admission.tenants import Tenant, tenant_key


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
        records = await pipe.execute()
    # A key's three records are written in one transaction; one missing is skipped.
    found = [(t, r) for (t, _), r in zip(owned, records, strict=True) if r]
    found.sort(key=lambda pair: (pair[0].name, float(pair[1]["created_at"])))
    return [_key_record(tenant, record) for tenant, record in found]


def _key_record(tenant: Tenant, record: dict[str, str]) -> KeyRecord:
    created = datetime.fromtimestamp(float(record["created_at"]), UTC)
    return KeyRecord(
        key_id=record["key_id"],
        tenant=tenant.name,
        status=record["status"],
        created=created.isoformat(timespec="seconds"),
        rpm=tenant.rpm,
        tpm=tenant.tpm,
        max_concurrency=tenant.max_concurrency,
        max_tokens=tenant.max_tokens,
    )
