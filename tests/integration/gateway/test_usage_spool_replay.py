"""The usage spool against a real Redis that is down, then up.

Each test spools events while nothing listens on Redis's port, then starts a
redis-server there and checks what reaches the stream: every event once, in
order, however the spool was left.
"""

import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from maas_services.common.redis_client import open_redis
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.usage.usage_emitter import REPLAY_BATCH, UsageEmitter
from maas_services.gateway.usage.usage_spool import UsageSpool
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process

# More than one replay batch, so batching and offsets are exercised.
EVENTS = 3 * REPLAY_BATCH + 7


def event(i: int) -> UsageEvent:
    return UsageEvent(
        request_id=f"r{i}", tenant="t", model="m", prompt_tokens=i, completion_tokens=1,
        started_at=time.time(),
    )  # fmt: skip


class Outage:
    """A Redis port that refuses connections until up() starts a server on it."""

    def __init__(self, state_dir: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process = redis_process(state_dir, self.port)

    async def up(self) -> None:
        self._process.start()
        await wait_ready(self._process, self.url, timeout=30)

    def stop(self) -> None:
        self._process.stop(timeout=10)


@pytest.fixture
async def outage(tmp_path) -> AsyncIterator[Outage]:
    down = Outage(tmp_path)
    try:
        yield down
    finally:
        down.stop()


@contextlib.asynccontextmanager
async def emitter(url: str, spool_dir: Path, claim_root: Path | None = None):
    redis = open_redis(url)
    usage = UsageEmitter(redis, UsageSpool.open(spool_dir), claim_root=claim_root)
    try:
        yield usage
    finally:
        await redis.aclose()


async def stream_ids(url: str) -> list[str]:
    redis = open_redis(url)
    try:
        return [fields["request_id"] for _, fields in await redis.xrange(USAGE_STREAM)]
    finally:
        await redis.aclose()


def bytes_read() -> int:
    """What this process has read through read(2) so far (sockets use recv(2))."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


async def test_events_spooled_in_an_outage_are_replayed_once_in_order(outage, tmp_path):
    spool_dir = tmp_path / "spool"
    async with emitter(outage.url, spool_dir) as usage:
        for i in range(EVENTS):
            await usage.emit(event(i))
        assert len(usage._spool) == EVENTS
        await outage.up()
        size = (spool_dir / "usage.jsonl").stat().st_size
        before = bytes_read()
        await usage.drain(usage._spool)
        read = bytes_read() - before
        # Linear: each spooled byte read about once (re-reading the file per
        # batch, as before, reads it about EVENTS / REPLAY_BATCH times).
        assert read < 1.5 * size, (read, size)
        await usage.emit(event(EVENTS))  # straight to the stream once the spool is empty
    assert await stream_ids(outage.url) == [f"r{i}" for i in range(EVENTS + 1)]
    assert (spool_dir / "usage.jsonl").read_bytes() == b""


async def test_a_torn_line_is_quarantined_and_the_rest_replayed(outage, tmp_path):
    spool_dir = tmp_path / "spool"
    metric = "maas_gateway_usage_spool_quarantined_total"
    quarantined = REGISTRY.get_sample_value(metric) or 0.0
    async with emitter(outage.url, spool_dir) as usage:
        for i in range(10):
            await usage.emit(event(i))
            if i == 4:  # what a write cut short by ENOSPC leaves behind
                with (spool_dir / "usage.jsonl").open("ab") as spool:
                    spool.write(event(99).model_dump_json()[:30].encode() + b"\n")
        await outage.up()
        await usage.drain(usage._spool)
    assert await stream_ids(outage.url) == [f"r{i}" for i in range(10)]
    assert REGISTRY.get_sample_value(metric) - quarantined == 1
    assert (spool_dir / "quarantine.jsonl").read_text().count("\n") == 1


async def test_shutdown_replays_the_whole_spool_when_redis_is_up(outage, tmp_path):
    async with emitter(outage.url, tmp_path / "spool") as usage:
        usage.start()
        for i in range(EVENTS):
            await usage.emit(event(i))
        await outage.up()
        await usage.stop()
    assert await stream_ids(outage.url) == [f"r{i}" for i in range(EVENTS)]


SPOOL_AND_DIE = """
import asyncio, os, signal, sys, time
from pathlib import Path
from maas_services.common.usage_event import UsageEvent
from maas_services.gateway.usage.usage_spool import UsageSpool

async def main():
    spool = UsageSpool.open(Path(sys.argv[1]))
    for i in range(int(sys.argv[2])):
        await spool.append(UsageEvent(request_id=f"gone{i}", tenant="t", model="m",
                                      prompt_tokens=1, completion_tokens=1, started_at=time.time()))
    print("spooled", flush=True)
    if sys.argv[3] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()

asyncio.run(main())
"""


def replica(spool_dir: Path, events: int, then: str) -> subprocess.Popen:
    """A gateway replica's spool in another process, spooled and then dead or alive."""
    child = subprocess.Popen(
        [sys.executable, "-c", SPOOL_AND_DIE, str(spool_dir), str(events), then],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    assert child.stdout.readline() == "spooled\n"
    return child


async def test_a_dead_replicas_spool_is_claimed_and_replayed_once(outage, tmp_path):
    root = tmp_path / "spools"
    dead = replica(root / "gateway-dead", 700, "die")
    assert dead.wait() == -9
    alive = replica(root / "gateway-alive", 3, "live")
    try:
        await outage.up()
        async with emitter(outage.url, root / "gateway-me", claim_root=root) as usage:
            await usage.claim_orphans()
            await usage.claim_orphans()
    finally:
        alive.stdin.close()
        alive.wait()
    assert await stream_ids(outage.url) == [f"gone{i}" for i in range(700)]
    assert not (root / "gateway-dead").exists()
    # A live replica's spool is its own to replay.
    assert (root / "gateway-alive" / "usage.jsonl").read_text().count("\n") == 3


async def test_a_settlement_rides_with_its_event_and_survives_a_script_flush(outage, tmp_path):
    await outage.up()
    redis = open_redis(outage.url)
    limiter = RateLimiter(redis, lease_seconds=60)
    who = Tenant(name="settling", tpm=100, max_concurrency=1)
    try:
        await limiter.admit(who, "r0", 1, need=50)
        # Redis forgets its scripts (a restart would): the settle sent along
        # with the event is refused, and sent again alone.
        await redis.script_flush()
        async with emitter(outage.url, tmp_path / "spool") as usage:
            await usage.emit(event(0), limiter.settlement(who, "r0", 1))
        assert await stream_ids(outage.url) == ["r0"]
        assert await redis.hget("maas:rl:{settling}:tokens", "r0") == "1"
        # Its lease ended: the tenant's one slot is free.
        assert (await limiter.admit(who, "r1", 1, need=10)).admitted
    finally:
        await redis.aclose()
