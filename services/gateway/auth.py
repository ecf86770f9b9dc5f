"""Bearer API-key authentication.

When Redis cannot be reached the gateway fails closed: it cannot tell a
revoked key from a good one, so it answers 503 rather than serve anyone.
"""

from redis.exceptions import RedisError

from services.common.logging import get_logger
from services.gateway.errors import unauthorized, unavailable
from services.gateway.tenants import Principal, TenantStore

log = get_logger(__name__)


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
    return token.strip()


async def authenticate(store: TenantStore, authorization: str | None) -> Principal:
    token = bearer_token(authorization)
    try:
        principal = await store.authenticate(token)
    except RedisError as exc:
        log.error("auth_store_unavailable", error=str(exc))
        raise unavailable("authentication is temporarily unavailable") from exc
    if principal is None:
        raise unauthorized("Incorrect API key provided.")
    return principal
