"""Bearer API-key authentication, with a short per-replica cache.

Every request needs its key checked, so verified keys are kept for
`ttl` seconds (0.5 s by default): a revoked key or a disabled tenant stops
working on every replica within that time, and a burst from one tenant costs
Redis one lookup per replica per TTL instead of one per request (requests that
find the entry expired together share one lookup).

When Redis cannot be reached, `fail_closed` answers 503: a replica cannot
tell a revoked key from a good one. `fail_open` serves keys this replica
verified in the last `max_stale` seconds (5 minutes by default), as they last
were: a key revoked during an outage works for at most that long. Older keys,
and keys it never saw, still get 503. A Redis that answers with an error
(not an outage) gets 503 under either policy, see store_faults.
"""

import time
from typing import Literal

from prometheus_client import Counter

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import unauthorized, unavailable
from maas_services.common.single_flight import SingleFlight
from maas_services.gateway.admission.store_faults import STORE_FAILURES, refused, unreachable
from maas_services.gateway.admission.tenants import Principal, TenantStore, hash_key

log = get_logger(__name__)

REDIS_DOWN = Counter(
    "maas_gateway_auth_redis_errors", "Key checks that could not reach Redis", ["outcome"]
)


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
    return token.strip()


class Authenticator:
    def __init__(
        self,
        store: TenantStore,
        ttl: float = 0.5,
        on_redis_error: Literal["fail_closed", "fail_open"] = "fail_closed",
        max_stale: float = 300.0,
    ):
        self._store = store
        self._ttl = ttl
        self._on_redis_error = on_redis_error
        self._max_stale = max_stale
        # sha256 of the key -> (checked at, principal or None for a refused key)
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        # By sha256 of the key: a burst that finds the entry expired waits for
        # one lookup instead of each sending its own.
        self._lookups: SingleFlight[Principal | None] = SingleFlight()

    async def authenticate(self, authorization: str | None) -> Principal:
        token = bearer_token(authorization)
        digest = hash_key(token)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < self._ttl:
            principal = cached[1]
        else:
            principal = await self._shared_lookup(token, digest, cached)
        if principal is None:
            raise unauthorized("Incorrect API key provided.")
        return principal

    async def _shared_lookup(self, token: str, digest: str, cached) -> Principal | None:
        return await self._lookups.run(digest, lambda: self._lookup(token, digest, cached))

    async def _lookup(self, token: str, digest: str, cached) -> Principal | None:
        try:
            principal = await self._store.authenticate(token)
        except STORE_FAILURES as exc:
            if not unreachable(exc):
                REDIS_DOWN.labels("refused").inc()
                raise refused("key store", exc) from exc
            if self._on_redis_error == "fail_open" and self._fresh_enough(cached):
                REDIS_DOWN.labels("served_from_cache").inc()
                log.warning("auth_served_from_cache", error=str(exc))
                return cached[1]
            REDIS_DOWN.labels("refused").inc()
            log.error("auth_store_unavailable", error=str(exc))
            raise unavailable("authentication is temporarily unavailable") from exc
        self._prune()
        self._cache[digest] = (time.monotonic(), principal)
        return principal

    def _fresh_enough(self, cached) -> bool:
        return cached is not None and time.monotonic() - cached[0] < self._max_stale

    def _prune(self) -> None:
        # Bounded memory under a flood of random keys: refused keys go first;
        # good keys are kept past their TTL, up to max_stale, because
        # fail_open serves them.
        if len(self._cache) > 10_000:
            self._cache = {
                k: v for k, v in self._cache.items() if v[1] is not None and self._fresh_enough(v)
            }
        if len(self._cache) > 10_000:
            now = time.monotonic()
            self._cache = {k: v for k, v in self._cache.items() if now - v[0] < self._ttl}
