"""Which Redis failures a fail-open policy may serve through.

Fail-open exists so that a store that cannot be reached (a restart, a network
partition, a timeout) does not become an outage of the API. A store that
answered and refused (out of memory under `noeviction`, a read-only replica
after a failover, any other error reply) is not down: serving through it
would turn a full Redis into a platform without limits or quotas. Those
refuse the request, with a 503 that names the cause.
"""

import builtins

from redis import exceptions

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import APIError, unavailable

log = get_logger(__name__)

UNREACHABLE = (
    exceptions.ConnectionError,
    exceptions.TimeoutError,
    builtins.ConnectionError,
    builtins.TimeoutError,
)
# Everything a store call can raise for the store's sake, reachable or not.
STORE_FAILURES = (exceptions.RedisError, *UNREACHABLE)


def unreachable(exc: BaseException) -> bool:
    return isinstance(exc, UNREACHABLE)


def refused(store: str, exc: BaseException) -> APIError:
    """The 503 for a store that answered with an error: why, without its raw text."""
    # Redis 6 wraps an error met inside a Lua script as "ERR Error running
    # script ... -OOM ...", so the reply's own code is looked for in the text too.
    text = str(exc)
    if isinstance(exc, exceptions.OutOfMemoryError) or "OOM command not allowed" in text:
        cause = f"the {store} is out of memory"
    elif isinstance(exc, exceptions.ReadOnlyError) or "READONLY" in text:
        cause = f"the {store} is read-only (a replica, or failing over)"
    else:
        cause = f"the {store} refused the request"
    log.error("store_refused", store=store, error=str(exc))
    return unavailable(f"Requests are refused for now: {cause}.")
