"""Publishes one usage event per finished request to the Redis stream.

When Redis is unreachable the event goes to a durable local spool instead
(usage_spool.py) and a replay task sends the spool, in order, once Redis is
back. A finished request's settlements ride in its event's round trip, ahead
of its XADD: the TPM's (rate_limiter.Settlement) and its prepaid balance
reservation's (quota_gate.ReservationSettlement), which must reach Redis
before billing can charge the event; when the event is spooled, each is sent
alone. While the spool holds anything, new events queue behind it, so billing
sees events in the order requests finished. Replay reads the spool in a
thread, never in the event loop, and at shutdown it runs until the spool is
empty (or Redis fails), so what SIGTERM cut short is billed before the pod
goes. Given `claim_root`, the directory every replica's spool lives in, the
replay task also replays the spools of replicas that are gone
(UsageSpool.claim), so a replica scaled away while Redis was down is still
billed.

Token counters are counted here, once per finished request: per model always,
per tenant only when `tenant_labels` is given (--metrics-tenant-labels), with
the tenant label bounded as services/common/tenant_labels.py describes.
"""

import asyncio
import contextlib
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from maas_services.common.logging import get_logger
from maas_services.common.tenant_labels import TenantLabels
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.usage.usage_spool import UsageSpool, orphans

log = get_logger(__name__)

EMITTED = Counter("maas_gateway_usage_events", "Usage events by outcome", ["outcome"])
SPOOLED = Gauge("maas_gateway_usage_spool_events", "Usage events waiting in the local spool")
TOKENS = Counter("maas_gateway_tokens", "Tokens served, by model and kind", ["model", "kind"])
TENANT_TOKENS = Counter(
    "maas_gateway_tenant_tokens", "Tokens served, by tenant and kind", ["tenant", "kind"]
)
REPLAY_BATCH = 500


class Settlement(Protocol):
    """A call that rides in the round trip of a usage event."""

    def queue(self, pipe: Pipeline) -> None: ...

    async def answered(self, result: object) -> None:
        """The queued call's result, or None when it was never sent."""


class UsageEmitter:
    def __init__(
        self,
        redis: Redis,
        spool: UsageSpool,
        replay_seconds: float = 1.0,
        tenant_labels: TenantLabels | None = None,
        claim_root: Path | None = None,
    ):
        self._redis = redis
        self._spool = spool
        self._claim_root = claim_root
        self._replay_seconds = replay_seconds
        self._tenants = tenant_labels
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()
        SPOOLED.set(len(spool))

    async def emit(self, event: UsageEvent, *settlements: Settlement | None) -> None:
        TOKENS.labels(event.model, "prompt").inc(event.prompt_tokens)
        TOKENS.labels(event.model, "completion").inc(event.completion_tokens)
        if self._tenants is not None:
            tenant = self._tenants.label(event.tenant)
            TENANT_TOKENS.labels(tenant, "prompt").inc(event.prompt_tokens)
            TENANT_TOKENS.labels(tenant, "completion").inc(event.completion_tokens)
        riding = [s for s in settlements if s is not None]
        settled = await self._send(event, riding)
        for settlement, result in zip(riding, settled, strict=True):
            await settlement.answered(result)

    async def _send(self, event: UsageEvent, settlements: list[Settlement]) -> list[object]:
        """Publish or spool the event; the settlements' results (None: not sent)."""
        async with self._spool.lock:
            if not self._spool.has_events():
                try:
                    settled: list[object] = []
                    if not settlements:
                        await self._redis.xadd(USAGE_STREAM, event.to_fields())
                    else:
                        pipe = self._redis.pipeline(transaction=False)
                        for settlement in settlements:
                            settlement.queue(pipe)
                        pipe.xadd(USAGE_STREAM, event.to_fields())
                        *settled, added = await pipe.execute(raise_on_error=False)
                        if isinstance(added, RedisError):
                            # Spooled, and settled again alone: harmless, a
                            # settle sets the charge, it does not add to it.
                            raise added
                    EMITTED.labels("published").inc()
                    return settled
                except RedisError as exc:
                    log.warning("usage_spooled", error=str(exc), request_id=event.request_id)
            await self._spool.append(event)
            EMITTED.labels("spooled").inc()
            SPOOLED.inc()
        return [None] * len(settlements)

    def start(self) -> None:
        self._task = asyncio.create_task(self._replay_forever())

    async def stop(self) -> None:
        # Not cancelled: a batch cut between its XADDs and its offset commit,
        # with the commit still running in its thread, would be read again.
        self._stopping.set()
        if self._task is not None:
            await self._task
        # What is left when Redis fails stays spooled for the next start or a claimer.
        await self.drain(self._spool)
        self._spool.close()

    async def replay(self, spool: UsageSpool | None = None) -> int:
        """Send one batch of spooled events in order; returns how many were sent."""
        if spool is None:
            spool = self._spool
        async with spool.lock:
            batch = await asyncio.to_thread(spool.next_batch, REPLAY_BATCH)
            sent = 0
            try:
                for entry in batch.entries:
                    await self._redis.xadd(USAGE_STREAM, entry.event.to_fields())
                    sent += 1
            except RedisError:
                pass
            await asyncio.to_thread(spool.commit, batch, sent)
            if spool is self._spool:
                SPOOLED.set(len(spool))
            if sent:
                EMITTED.labels("replayed").inc(sent)
                log.info(
                    "usage_spool_replayed", spool=str(spool.path), events=sent, left=len(spool)
                )
            return sent

    async def drain(self, spool: UsageSpool) -> None:
        """Replay until `spool` is empty or a batch gets nothing through."""
        while spool.has_events():
            before = len(spool)
            await self.replay(spool)
            if len(spool) == before:
                return

    async def claim_orphans(self) -> None:
        """Replay, then remove, the spools of replicas that are gone."""
        if self._claim_root is None:
            return
        found = orphans(self._claim_root, self._spool.directory)
        for directory in await asyncio.to_thread(list, found):
            orphan = await asyncio.to_thread(UsageSpool.claim, directory)
            if orphan is None:
                continue
            try:
                log.info("usage_spool_claimed", spool=str(directory), events=len(orphan))
                await self.drain(orphan)
                if not orphan.has_events():
                    await asyncio.to_thread(orphan.remove)
            finally:
                orphan.close()

    async def _redis_up(self) -> bool:
        """Whether to claim now: a claimed spool is read to count it, so claiming
        while Redis is down would re-read every orphan on every tick."""
        try:
            return bool(await self._redis.ping())
        except RedisError:
            return False

    async def _replay_forever(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._replay_seconds)
                return
            try:
                if self._spool.has_events():
                    await self.drain(self._spool)
                if not self._spool.has_events() and await self._redis_up():
                    await self.claim_orphans()
            except OSError as exc:
                # A full or failing disk must not end replay for good.
                log.error("usage_spool_replay_failed", error=str(exc))
