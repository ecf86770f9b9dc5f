"""Refuse tenants whose prepaid balance or monthly token budget cannot pay for a request.

Two steps, as the rate limiter's. `check`, before any work is done for the
request, refuses a tenant whose balance is used up or whose month's tokens
reached its budget. `reserve`, once the prompt is tokenized and the deployment
known, holds the most the request can cost (prompt + n x max_tokens at the
deployment's price) against the prepaid balance less what requests in flight
already hold, atomically in Redis (services/common/balance_reservations.py):
twenty concurrent requests against a balance worth one get one admission and
nineteen 429 `insufficient_quota`. When the request ends its reservation is
settled to the real cost in the round trip of its usage event, and billing's
ledger drops it in the commit that charges the balance; a request with nothing
to bill releases it. A reservation lapses after `hold_seconds`, so a replica
that dies mid-request holds no balance for ever; the default outlasts any
request (hold, queue and request timeouts) plus billing's lag.

The quota state is billing's, laid out in services/common/quota.py and
billing_keys.py (billing writes it, the gateway only reads it). Like rate limits, a Redis
outage fails open by default: serving a few requests past a quota is cheaper
than refusing every tenant, and the ledger still bills them. Only an outage:
a Redis that answers with an error refuses the request (see store_faults).

A tenant's state is read at most once per `ttl` seconds per replica (0.5 s,
as keys are): the ledger moves it only as usage events are billed, seconds
after the requests, so a read per request bought no accuracy for its round
trip; the reservation reads the balance itself, in its script. What the store
could not answer is never kept.
"""

import time
from dataclasses import dataclass

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from maas_services.common.balance_reservations import (
    RELEASE,
    RESERVE,
    SETTLE,
    full_guard_key,
    reservation_keys,
)
from maas_services.common.billing_keys import balance_key
from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import APIError, unavailable
from maas_services.common.prices import ModelPrice
from maas_services.common.quota import Quotas, QuotaState
from maas_services.common.usage_event import UsageEvent
from maas_services.gateway.admission.published_prices import PublishedPrices
from maas_services.gateway.admission.store_faults import STORE_FAILURES, refused, unreachable
from maas_services.gateway.admission.store_trip import StoreCall, replies

log = get_logger(__name__)

QUOTA_CHECKS = Counter("maas_gateway_quota_checks", "Quota checks by outcome", ["outcome"])
# Longer than a request can live with the default timeouts (a cold-start hold of
# 120 s, a queue wait of 30 s, a request of 600 s) and billing's lag behind it.
RESERVATION_SECONDS = 3600.0


def insufficient_quota(reason: str) -> APIError:
    return APIError(
        429,
        f"You exceeded your current quota: {reason}. Top up or raise the budget to continue.",
        type="insufficient_quota",
        code="insufficient_quota",
    )


def usd(nano: int) -> str:
    return f"${nano / 1e9:.6f}"


@dataclass
class Reservation:
    """A prepaid request's hold on its tenant's balance, from admission until billed."""

    gate: "QuotaGate"
    tenant: str
    request_id: str
    # The price it was reserved at, which its real cost is settled at.
    price: ModelPrice | None = None
    # Redis may hold it (reserved, or asked and the answer lost): the request's
    # end must settle or release it.
    held: bool = False

    async def take(self, deployment: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Hold the most the request can cost, or raise 429 insufficient_quota."""
        await self.gate.reserve(self, deployment, prompt_tokens, completion_tokens)

    def settlement(self, event: UsageEvent) -> "ReservationSettlement | None":
        """The settle to the event's real cost, to send with the event (usage_emitter.py);
        from then on billing's commit releases it."""
        if not self.held or self.price is None:
            return None
        self.held = False
        # A batch line costs its batch price (prices.py), as billing prices it.
        price = self.price.for_batch() if event.batch_id else self.price
        cost = price.cost_nano_usd(
            event.prompt_tokens, event.cached_prompt_tokens, event.completion_tokens
        )
        return ReservationSettlement(self, cost)

    async def release(self) -> None:
        """Give the hold back: the request ends with nothing to bill."""
        if not self.held:
            return
        self.held = False
        await self.gate.release(self)


@dataclass(frozen=True)
class ReservationSettlement:
    """A reservation's settle, sent in the round trip of its usage event."""

    reservation: Reservation
    cost_nano_usd: int

    def queue(self, pipe: Pipeline) -> None:
        self.reservation.gate.queue_settle(pipe, self)

    async def answered(self, result: object) -> None:
        """The queued call's result, or None when it was never sent."""
        if result is None or isinstance(result, NoScriptError):
            # Unsent (the event was spooled), or Redis lost its scripts: alone.
            await self.reservation.gate.settle(self)
        elif isinstance(result, Exception):
            log.warning("balance_settle_failed", tenant=self.reservation.tenant, error=str(result))


@dataclass(frozen=True)
class HoldCall(StoreCall):
    """reserve()'s script as a StoreCall, to send with another gate's (store_trip.py)."""

    reservation: Reservation
    cost_nano_usd: int


class QuotaGate:
    def __init__(
        self,
        redis: Redis,
        on_redis_error: str = "fail_open",
        ttl: float = 0.5,
        hold_seconds: float = RESERVATION_SECONDS,
    ):
        self._quotas = Quotas(redis)
        self._prices = PublishedPrices(redis)
        self._reserve = redis.register_script(RESERVE)
        self._settle = redis.register_script(SETTLE)
        self._release = redis.register_script(RELEASE)
        self._hold_ms = int(hold_seconds * 1000)
        self._fail_open = on_redis_error == "fail_open"
        self._ttl = ttl
        # tenant -> (read at, its state)
        self._cache: dict[str, tuple[float, QuotaState]] = {}

    async def _state(self, tenant: str) -> QuotaState:
        now = time.monotonic()
        cached = self._cache.get(tenant)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        state = await self._quotas.state(tenant)
        if len(self._cache) > 10_000:
            self._cache = {t: v for t, v in self._cache.items() if now - v[0] < self._ttl}
        self._cache[tenant] = (now, state)
        return state

    async def check(self, tenant: str) -> None:
        try:
            state = await self._state(tenant)
        except STORE_FAILURES as exc:
            self._store_failed(tenant, exc)
            return
        if state.exhausted:
            QUOTA_CHECKS.labels("exhausted").inc()
            raise insufficient_quota(state.exhausted)
        QUOTA_CHECKS.labels("ok").inc()

    def reservation(self, tenant: str, request_id: str) -> Reservation:
        """The request's reservation, not yet taken (Reservation.take)."""
        return Reservation(self, tenant, request_id)

    async def reserve(
        self, reservation: Reservation, deployment: str, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """Hold the most `prompt_tokens` and `completion_tokens` can cost at the
        deployment's price against a prepaid balance, or raise the 429. A tenant
        without a balance (pay as you go) holds nothing."""
        call = await self.hold_call(reservation, deployment, prompt_tokens, completion_tokens)
        if call is not None:
            self.hold_answered(call, (await replies(call))[0])

    async def hold_call(
        self,
        reservation: Reservation,
        deployment: str,
        prompt_tokens: int,
        completion_tokens: int,
        adapter: str = "",
    ) -> HoldCall | None:
        """reserve()'s script as a call to send with another's; None when there is
        nothing to hold (pay as you go, or the store unreachable and the policy open).
        `adapter`: the LoRA adapter the request runs with, which may have its own price."""
        tenant = reservation.tenant
        try:
            if (await self._state(tenant)).balance_nano_usd is None:
                return None
            table = await self._prices.table()
        except STORE_FAILURES as exc:
            self._store_failed(tenant, exc)
            return None
        if table is None:
            # Billing has published no prices yet: only a used-up balance refuses.
            QUOTA_CHECKS.labels("unpriced").inc()
        price = table.for_served(deployment, adapter) if table else ModelPrice()
        cost = price.most_nano_usd(prompt_tokens, completion_tokens)
        reservation.price = price
        # From here a cancelled call may have reserved: the request's end releases.
        reservation.held = True
        return HoldCall(
            self._reserve,
            [*reservation_keys(tenant), full_guard_key(tenant)],
            [reservation.request_id, cost, self._hold_ms, balance_key(tenant)],
            reservation,
            cost,
        )

    def hold_answered(self, call: HoldCall, reply: object) -> None:
        """The hold's reply (or the store's exception for it); raises the 429."""
        reservation, cost = call.reservation, call.cost_nano_usd
        if isinstance(reply, BaseException):
            # Refused by Redis, the script changed nothing; unreachable, it may have.
            reservation.held = unreachable(reply)
            self._store_failed(reservation.tenant, reply)
            return
        admitted, available = reply
        if not admitted:
            reservation.held = False
            QUOTA_CHECKS.labels("insufficient").inc()
            raise insufficient_quota(
                f"this request can cost up to {usd(cost)} and the prepaid balance has "
                f"{usd(max(available, 0))} left beside the requests in flight"
            )
        if available < 0:  # the balance is gone: pay as you go now, nothing held
            reservation.held = False
        QUOTA_CHECKS.labels("reserved").inc()

    def queue_settle(self, pipe: Pipeline, s: ReservationSettlement) -> None:
        # EVALSHA, not the Script: a pipeline holding Scripts asks SCRIPT EXISTS first.
        keys = reservation_keys(s.reservation.tenant)
        pipe.evalsha(self._settle.sha, len(keys), *keys, s.reservation.request_id, s.cost_nano_usd)

    async def settle(self, s: ReservationSettlement) -> None:
        await self._run_alone(
            self._settle, s.reservation, [s.reservation.request_id, s.cost_nano_usd]
        )

    async def release(self, reservation: Reservation) -> None:
        await self._run_alone(self._release, reservation, [reservation.request_id])

    async def _run_alone(self, script, reservation: Reservation, args: list) -> None:
        try:
            await script(keys=reservation_keys(reservation.tenant), args=args)
        except STORE_FAILURES as exc:
            # It lapses at its deadline, or goes when billing charges the request.
            log.warning("balance_reservation_unsettled", tenant=reservation.tenant, error=str(exc))

    def _store_failed(self, tenant: str, exc: BaseException) -> None:
        """Fail open (return), or raise what the policy and the failure say."""
        QUOTA_CHECKS.labels("redis_error").inc()
        if not unreachable(exc):
            raise refused("quota store", exc) from exc
        log.warning("quota_unchecked", tenant=tenant, error=str(exc))
        if not self._fail_open:
            raise unavailable("quota checks are temporarily unavailable") from exc
