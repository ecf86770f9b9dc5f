"""Tenants and API keys in Redis.

A key is shown once, at creation; Redis only ever holds its SHA-256, so a
leaked dump does not leak working keys. Layout:
  maas:tenants                 set of tenant names
  maas:tenant:<name>           hash: name, tier, status, created_at
  maas:tenant:<name>:keys      set of key ids
  maas:apikey:<sha256>         hash: tenant, key_id, status, created_at
  maas:keyid:<key_id>          the key's sha256, so a key can be revoked by id
"""

import hashlib
import secrets
import time
from dataclasses import dataclass

from redis.asyncio import Redis

KEY_PREFIX = "sk-maas-"


@dataclass(frozen=True)
class Tenant:
    name: str
    tier: str
    status: str

    @property
    def active(self) -> bool:
        return self.status == "active"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant and which of its keys."""

    tenant: Tenant
    key_id: str


class TenantExistsError(ValueError):
    pass


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class TenantStore:
    def __init__(self, redis: Redis):
        self._redis = redis

    async def create_tenant(self, name: str, tier: str = "standard") -> Tenant:
        created = await self._redis.sadd("maas:tenants", name)
        if not created:
            raise TenantExistsError(f"tenant {name!r} already exists")
        await self._redis.hset(
            f"maas:tenant:{name}",
            mapping={"name": name, "tier": tier, "status": "active", "created_at": time.time()},
        )
        return Tenant(name, tier, "active")

    async def get_tenant(self, name: str) -> Tenant | None:
        raw = await self._redis.hgetall(f"maas:tenant:{name}")
        if not raw:
            return None
        return Tenant(raw["name"], raw.get("tier", "standard"), raw.get("status", "active"))

    async def create_key(self, tenant: str) -> tuple[str, str]:
        """Return (key id, the API key itself); the key is not stored anywhere."""
        if await self.get_tenant(tenant) is None:
            raise KeyError(f"tenant {tenant!r} does not exist")
        api_key = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = "key_" + secrets.token_hex(6)
        digest = hash_key(api_key)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                f"maas:apikey:{digest}",
                mapping={
                    "tenant": tenant,
                    "key_id": key_id,
                    "status": "active",
                    "created_at": time.time(),
                },
            )
            pipe.set(f"maas:keyid:{key_id}", digest)
            pipe.sadd(f"maas:tenant:{tenant}:keys", key_id)
            await pipe.execute()
        return key_id, api_key

    async def authenticate(self, api_key: str) -> Principal | None:
        """The active principal for this key, or None (unknown, revoked, disabled)."""
        record = await self._redis.hgetall(f"maas:apikey:{hash_key(api_key)}")
        if not record or record.get("status") != "active":
            return None
        tenant = await self.get_tenant(record["tenant"])
        if tenant is None or not tenant.active:
            return None
        return Principal(tenant, record["key_id"])
