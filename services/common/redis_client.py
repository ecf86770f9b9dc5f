"""One way to open Redis, so timeouts, decoding and credentials match everywhere.

Credentials are the URL's (``redis://USER:PASSWORD@host:6379/0``, as `maas up`
hands them to its children) or else MAAS_REDIS_USERNAME and MAAS_REDIS_PASSWORD
(the chart's, the password from a Secret: any characters, no URL quoting), never
a flag, which every user of the host can read. Each service is its own ACL user
(maas_services.common.redis_acl).
"""

import asyncio
import os

import redis.asyncio as aioredis

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
USERNAME_ENV = "MAAS_REDIS_USERNAME"
PASSWORD_ENV = "MAAS_REDIS_PASSWORD"


# Connections per process, and how long a command waits for one when all are busy.
# redis-py's default pool refuses a command past 100 connections (MaxConnectionsError)
# instead of waiting: a flood of one tenant's requests then made the limiter's and the
# quota's checks fail, which fail open, so every tenant on the replica ran unlimited.
# Commands are sub-millisecond, so a few dozen connections serve thousands of requests
# a second; a command waits for a free one, within the socket timeout's bound.
MAX_CONNECTIONS = 64
POOL_WAIT_SECONDS = 5.0


def open_redis(url: str) -> aioredis.Redis:
    # Short socket timeouts: a dead Redis must surface as an error in a
    # request's lifetime, not hang it. Credentials in the URL win over these.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_SECONDS,
        username=os.environ.get(USERNAME_ENV) or None,
        password=os.environ.get(PASSWORD_ENV) or None,
        decode_responses=True,
        socket_connect_timeout=2.0,
        socket_timeout=5.0,
    )
    return aioredis.Redis(connection_pool=pool)


def honour_swallowed_cancel() -> None:
    """Raise CancelledError if this task was cancelled and the error was lost.

    redis-py can swallow a cancellation that lands inside a command
    (redis/redis-py#2028, #2551); the task still counts the request, so a loop
    of Redis calls checks it between iterations or never stops.
    """
    if asyncio.current_task().cancelling():
        raise asyncio.CancelledError
