"""`maas up`'s default state dir is relative (.maas): its Redis must still find its ACL file."""

import asyncio
from pathlib import Path

from maas_services.common.redis_acl import USER_NAMES
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process


def test_redis_starts_from_a_relative_state_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    passwords = {user: f"password-{user}" for user in USER_NAMES}
    port = free_port()
    process = redis_process(Path(".maas"), port, passwords)
    process.start()
    try:
        url = f"redis://probe:{passwords['probe']}@127.0.0.1:{port}/0"
        asyncio.run(wait_ready(process, url, timeout=30))
    finally:
        process.stop(timeout=10)
