"""Tenants and API keys in Redis.

A key is shown once, at creation; Redis only ever holds its SHA-256, so a
leaked dump does not leak working keys. Layout:
  maas:tenants                 set of tenant names
  maas:tenant:<name>           hash: the Tenant's fields (limits included)
  maas:tenant:<name>:keys      set of key ids
  maas:apikey:<sha256>         hash: tenant, key_id, status, created_at
  maas:keyid:<key_id>          the key's sha256, so a key can be revoked by id

A limit of 0 means unlimited; an empty allowed_models means every model.
"""

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from redis.asyncio import Redis

KEY_PREFIX = "sk-maas-"
LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency", "max_tokens")


class Tenant(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    tier: str = Field("standard", min_length=1)
    status: Literal["active", "disabled"] = "active"
    rpm: int = Field(0, ge=0, description="requests per minute")
    tpm: int = Field(0, ge=0, description="tokens (prompt + completion) per minute")
    max_concurrency: int = Field(0, ge=0, description="requests in flight at once")
    max_tokens: int = Field(0, ge=0, description="cap on one request's max_tokens")
    adapter_loads_per_minute: int = Field(
        0,
        ge=0,
        description="on-demand LoRA adapter loads per minute, across the gateway's replicas"
        " (0: the gateway's adapter_loads_per_minute; upstream/adapter_loads.py)",
    )
    allowed_models: tuple[str, ...] = ()
    created_at: float = 0.0

    @property
    def active(self) -> bool:
        return self.status == "active"

    @property
    def limited(self) -> bool:
        return bool(self.rpm or self.tpm or self.max_concurrency)

    def may_use(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    # Redis hashes hold strings: the model list travels comma-joined.
    @field_validator("allowed_models", mode="before")
    @classmethod
    def _split_models(cls, value):
        if isinstance(value, str):
            return tuple(m for m in value.split(",") if m)
        return value

    def to_fields(self) -> dict[str, str]:
        fields = self.model_dump()
        fields["allowed_models"] = ",".join(self.allowed_models)
        return {name: str(value) for name, value in fields.items()}


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant and which of its keys."""

    tenant: Tenant
    key_id: str


class TenantExistsError(ValueError):
    pass


class TenantNotFoundError(KeyError):
    pass


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def tenant_key(name: str) -> str:
    return f"maas:tenant:{name}"


class TenantStore:
    def __init__(self, redis: Redis):
        self._redis = redis

    async def create_tenant(self, name: str, tier: str = "standard", **limits) -> Tenant:
        tenant = Tenant(name=name, tier=tier, created_at=time.time(), **limits)
        if not await self._redis.sadd("maas:tenants", name):
            raise TenantExistsError(f"tenant {name!r} already exists")
        await self._redis.hset(tenant_key(name), mapping=tenant.to_fields())
        return tenant

    async def get_tenant(self, name: str) -> Tenant | None:
        raw = await self._redis.hgetall(tenant_key(name))
        return Tenant.model_validate(raw) if raw else None

    async def list_tenants(self) -> list[Tenant]:
        names = sorted(await self._redis.smembers("maas:tenants"))
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(tenant_key(name))
            records = await pipe.execute()
        return [Tenant.model_validate(raw) for raw in records if raw]

    async def update_tenant(self, name: str, **changes) -> Tenant:
        current = await self.get_tenant(name)
        if current is None:
            raise TenantNotFoundError(f"tenant {name!r} does not exist")
        # Validate the merged record, so a bad value never reaches Redis.
        updated = Tenant.model_validate({**current.model_dump(), **changes})
        await self._redis.hset(tenant_key(name), mapping=updated.to_fields())
        return updated

    async def disable_tenant(self, name: str) -> Tenant:
        return await self.update_tenant(name, status="disabled")

    async def create_key(self, tenant: str) -> tuple[str, str]:
        """Return (key id, the API key itself); the key is not stored anywhere."""
        if await self.get_tenant(tenant) is None:
            raise TenantNotFoundError(f"tenant {tenant!r} does not exist")
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

    async def revoke_key(self, key_id: str) -> bool:
        """Mark the key revoked (the record stays, for audit); False if no such key."""
        digest = await self._redis.get(f"maas:keyid:{key_id}")
        if digest is None:
            return False
        await self._redis.hset(f"maas:apikey:{digest}", "status", "revoked")
        return True

    async def authenticate(self, api_key: str) -> Principal | None:
        """The active principal for this key, or None (unknown, revoked, disabled)."""
        record = await self._redis.hgetall(f"maas:apikey:{hash_key(api_key)}")
        if not record or record.get("status") != "active":
            return None
        tenant = await self.get_tenant(record["tenant"])
        if tenant is None or not tenant.active:
            return None
        return Principal(tenant, record["key_id"])
