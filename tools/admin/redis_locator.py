"""Which Redis the admin commands talk to, with no flags in the common cases.

In order: --redis-url, then MAAS_REDIS_URL (a cluster, a CI job), then the
stack that `maas up` is running from the state directory (.maas/stack.json,
or MAAS_STATE_DIR): the admin CLI on a laptop needs no configuration.
"""

import json
import os
from pathlib import Path


class RedisNotFoundError(RuntimeError):
    pass


def locate_redis(flag: str | None, state_dir: str | None) -> str:
    if flag:
        return flag
    if os.environ.get("MAAS_REDIS_URL"):
        return os.environ["MAAS_REDIS_URL"]
    state = Path(state_dir or os.environ.get("MAAS_STATE_DIR", ".maas")) / "stack.json"
    try:
        return json.loads(state.read_text())["redis_url"]
    except (OSError, ValueError, KeyError):
        raise RedisNotFoundError(
            f"no Redis to manage: no running local stack ({state} is missing or unreadable) "
            "and MAAS_REDIS_URL is not set; start one with `maas up` or pass --redis-url"
        ) from None
