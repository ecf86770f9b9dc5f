"""Per-tenant RPM, TPM and concurrency limits, exact across gateway replicas.

A request is counted (RPM) and takes its concurrency lease at admission,
before any work is done for it; once its prompt is tokenized it reserves
prompt + max_tokens (TPM), and it settles to what it really used when it
ends, so the TPM window holds real usage, not guesses. A request with n
sequences costs n of the tenant's concurrency.

Two round trips before the first token are one too many for a tenant with
room: one this replica last admitted is admitted once tokenized, counted and
charged in one call (`admit` given `need`), or, without a TPM, counted
while the tokenizer works. A tenant it last refused, or
has not seen, is counted before the tokenizer is asked, so a tenant at its
limits still costs no work but the refusal (see `counts_first`).

When Redis cannot be reached (connection errors, timeouts), `fail_open`
serves the request without limits (logged and counted in
maas_gateway_rate_limit_bypassed_total): an outage of the limiter should not
become an outage of the API. `fail_closed` answers 503. A Redis that answers
with an error (out of memory, read-only) refuses the request under either
policy: see store_faults.
"""

import dataclasses
import time
from dataclasses import dataclass
from typing import Literal

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import APIError, unavailable
from maas_services.gateway.admission.limiter_scripts import ADMIT, RESERVE, SETTLE
from maas_services.gateway.admission.store_faults import STORE_FAILURES, refused, unreachable
from maas_services.gateway.admission.store_trip import StoreCall, replies
from maas_services.gateway.admission.tenants import Tenant

log = get_logger(__name__)

REFUSED = Counter("maas_gateway_rate_limited", "Requests refused by a tenant limit", ["reason"])
BYPASSED = Counter(
    "maas_gateway_rate_limit_bypassed", "Requests served unlimited because Redis was unreachable"
)


def format_duration(ms: int) -> str:
    """OpenAI's reset format: "20ms", "1.5s", "6m0s"."""
    if ms < 1000:
        return f"{ms}ms"
    minutes, seconds = divmod(ms / 1000, 60)
    text = f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


@dataclass(frozen=True)
class LimitDecision:
    tenant: Tenant
    admitted: bool
    reason: str = ""
    retry_after_ms: int = 0
    requests_left: int = 0
    tokens_left: int = 0
    reset_ms: int = 0
    # The tokens a "tokens" or "too_large" refusal is about: the floor or the need.
    asked: int = 0
    # Admitted without asking Redis (it was down): there are no counts to report.
    bypassed: bool = False

    def headers(self) -> dict[str, str]:
        """x-ratelimit-* for each limit the tenant has; unlimited ones have none."""
        headers = {}
        if self.bypassed:
            return headers
        for kind, limit, left in (
            ("requests", self.tenant.rpm, self.requests_left),
            ("tokens", self.tenant.tpm, self.tokens_left),
        ):
            if limit:
                headers[f"x-ratelimit-limit-{kind}"] = str(limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(left)
                headers[f"x-ratelimit-reset-{kind}"] = format_duration(self.reset_ms)
        return headers

    def error(self, need: int) -> APIError:
        tenant = self.tenant
        messages = {
            "requests": f"Rate limit reached for requests: limit {tenant.rpm} per minute.",
            "tokens": f"Rate limit reached for tokens: limit {tenant.tpm} per minute, "
            f"used {tenant.tpm - self.tokens_left}, requested {need}.",
            "too_large": f"Request too large: it needs {need} tokens (prompt + max_tokens) "
            f"and your limit is {tenant.tpm} tokens per minute.",
            "concurrency": f"Too many concurrent requests: limit {tenant.max_concurrency}.",
        }
        # Whole seconds, rounded up: retrying early would only be refused again.
        retry_after = max(1, -(-self.retry_after_ms // 1000))
        return APIError(
            429,
            messages[self.reason],
            type="requests" if self.reason != "tokens" else "tokens",
            code="rate_limit_exceeded",
            headers={**self.headers(), "Retry-After": str(retry_after)},
        )


@dataclass(frozen=True)
class Settlement:
    """A request's settle(), sent in the round trip of its usage event
    (usage_emitter.py) instead of one of its own."""

    limiter: "RateLimiter"
    tenant: Tenant
    request_id: str
    used: int
    sequences: int

    def queue(self, pipe: Pipeline) -> None:
        self.limiter.queue_settle(pipe, self)

    async def answered(self, result: object) -> None:
        """The queued call's result, or None when it was never sent."""
        if result is None or isinstance(result, NoScriptError):
            # Unsent, or Redis lost its scripts (a restart): alone, as before.
            await self.limiter.settle(self.tenant, self.request_id, self.used, self.sequences)
        elif isinstance(result, Exception):
            log.warning("rate_limit_settle_failed", tenant=self.tenant.name, error=str(result))


@dataclass(frozen=True)
class LimiterCall(StoreCall):
    """admit() or reserve() as a StoreCall, to send with another gate's (store_trip.py)."""

    tenant: Tenant
    # admit(): the request is counted, so an RPM refusal blocks the tenant.
    counting: bool


class RateLimiter:
    def __init__(
        self,
        redis: Redis,
        lease_seconds: float,
        on_redis_error: Literal["fail_open", "fail_closed"] = "fail_open",
        window_seconds: float = 60.0,
    ):
        self._admit = redis.register_script(ADMIT)
        self._reserve = redis.register_script(RESERVE)
        self._settle = redis.register_script(SETTLE)
        self._lease_ms = int(lease_seconds * 1000)
        # "Per minute" is the API's promise; tests shorten it to see it slide.
        self._window_ms = int(window_seconds * 1000)
        # (tenant, its rpm) -> (when refused, the refusal), see _rpm_blocked.
        self._blocked: dict[tuple[str, int], tuple[float, LimitDecision]] = {}
        # Tenants whose last answer on this replica was an admission.
        self._roomy: set[str] = set()
        self._on_redis_error = on_redis_error

    @staticmethod
    def _keys(tenant: str) -> list[str]:
        parts = ("log", "tokens", "sum", "inflight", "full")
        return [f"maas:rl:{{{tenant}}}:{part}" for part in parts]

    def counts_first(self, tenant: Tenant) -> bool:
        """Whether to count the request before tokenizing it (admit, then
        reserve) rather than after (admit with its need): see the module doc.
        Without a TPM there is nothing to charge once tokenized: such a request
        is counted while it is tokenized instead (pipeline.py).

        The one-call path is claimed here and given back by the admission, so a
        tenant has at most one uncounted request at the tokenizer: a burst is
        counted before its requests are tokenized, all but the first."""
        if tenant.name not in self._roomy:
            return True
        self._roomy.discard(tenant.name)
        return False

    async def admit(
        self, tenant: Tenant, request_id: str, floor: int, sequences: int = 1, need: int = 0
    ) -> LimitDecision:
        """Count the request and take its lease of `sequences` slots, or raise the 429.

        `floor` is the fewest tokens it can need (n x max_tokens): a request
        that cannot fit the TPM is refused before it is tokenized. Given its
        `need` (prompt + max_tokens), the request is also charged it, as
        reserve() would."""
        call = self.admit_call(tenant, request_id, floor, sequences, need)
        if call is None:
            return LimitDecision(tenant, admitted=True)
        return self.decided(call, (await replies(call))[0])

    def admit_call(
        self, tenant: Tenant, request_id: str, floor: int, sequences: int = 1, need: int = 0
    ) -> LimiterCall | None:
        """admit() as a call to send with another's (None: nothing to ask); raises
        the 429 of a tenant still refused for RPM without asking."""
        if not tenant.limited:
            return None
        self.refuse_blocked(tenant, floor)
        args = [
            request_id,
            tenant.rpm,
            tenant.tpm,
            tenant.max_concurrency,
            floor,
            self._window_ms,
            self._lease_ms,
            sequences,
            need,
        ]
        return LimiterCall(self._admit, self._keys(tenant.name), args, tenant, counting=True)

    async def reserve(self, admitted: LimitDecision, request_id: str, need: int) -> LimitDecision:
        """Charge an admitted request's `need` tokens, or raise the 429. A refused
        request keeps its lease: settle() it, as any request that ends."""
        call = self.reserve_call(admitted, request_id, need)
        if call is None:
            return admitted
        return self.decided(call, (await replies(call))[0])

    def reserve_call(
        self, admitted: LimitDecision, request_id: str, need: int
    ) -> LimiterCall | None:
        """reserve() as a call to send with another's (None: nothing to charge)."""
        tenant = admitted.tenant
        if not tenant.tpm or admitted.bypassed:
            return None
        args = [request_id, tenant.rpm, tenant.tpm, need, self._window_ms]
        return LimiterCall(self._reserve, self._keys(tenant.name), args, tenant, counting=False)

    def decided(self, call: LimiterCall, reply: object) -> LimitDecision:
        """The decision in a call's reply (or the store's exception for it), or its 429."""
        tenant = call.tenant
        if isinstance(reply, BaseException):
            if not unreachable(reply):
                raise refused("rate-limit store", reply) from reply
            decision = self._redis_down(tenant, reply)
        else:
            decision = LimitDecision(tenant, bool(reply[0]), *reply[1:])
        if call.counting and not decision.admitted and decision.reason == "requests":
            self._blocked[(tenant.name, tenant.rpm)] = (time.monotonic(), decision)
        return self._raise_refused(decision)

    def _raise_refused(self, decision: LimitDecision) -> LimitDecision:
        name = decision.tenant.name
        if decision.admitted:
            if len(self._roomy) > 10_000:
                self._roomy.clear()
            self._roomy.add(name)
            return decision
        self._roomy.discard(name)
        REFUSED.labels(decision.reason).inc()
        raise decision.error(decision.asked)

    def refuse_blocked(self, tenant: Tenant, floor: int) -> None:
        """Raise the 429 of a tenant still refused for RPM (see _rpm_blocked):
        free of Redis, so a flood is shed before any other store is asked."""
        blocked = self._rpm_blocked(tenant)
        if blocked is not None:
            REFUSED.labels("requests").inc()
            raise blocked.error(floor)

    def _rpm_blocked(self, tenant: Tenant) -> LimitDecision | None:
        """A refusal for RPM stays true until its Retry-After: nothing but time
        frees a place in the request window. So a flooding tenant is refused
        here, without a Redis call, until then (a changed limit starts over)."""
        key = (tenant.name, tenant.rpm)
        if key not in self._blocked:
            return None
        since, decision = self._blocked[key]
        elapsed = int((time.monotonic() - since) * 1000)
        if elapsed >= decision.retry_after_ms:
            del self._blocked[key]
            return None
        return dataclasses.replace(
            decision,
            retry_after_ms=decision.retry_after_ms - elapsed,
            reset_ms=max(decision.reset_ms - elapsed, 0),
        )

    def _redis_down(self, tenant: Tenant, exc: BaseException) -> LimitDecision:
        if self._on_redis_error == "fail_closed":
            log.error("rate_limiter_unavailable", tenant=tenant.name, error=str(exc))
            raise unavailable("rate limiting is temporarily unavailable") from exc
        BYPASSED.inc()
        log.warning("rate_limit_bypassed", tenant=tenant.name, error=str(exc))
        return LimitDecision(tenant, admitted=True, bypassed=True)

    def settlement(
        self, tenant: Tenant, request_id: str, used: int, sequences: int = 1
    ) -> Settlement | None:
        """settle() to send along another call; None when there is nothing to settle."""
        if not tenant.limited:
            return None
        return Settlement(self, tenant, request_id, used, sequences)

    def queue_settle(self, pipe: Pipeline, s: Settlement) -> None:
        # EVALSHA, not the Script: a pipeline holding Scripts asks SCRIPT EXISTS first.
        args = [s.request_id, s.used, self._window_ms, s.sequences]
        pipe.evalsha(self._settle.sha, 5, *self._keys(s.tenant.name), *args)

    async def settle(self, tenant: Tenant, request_id: str, used: int, sequences: int = 1) -> None:
        """Charge what the request really used and end its concurrency lease."""
        if not tenant.limited:
            return
        try:
            await self._settle(
                keys=self._keys(tenant.name),
                args=[request_id, used, self._window_ms, sequences],
            )
        except STORE_FAILURES as exc:
            # The lease expires on its own; the window charge stays at the reservation.
            log.warning("rate_limit_settle_failed", tenant=tenant.name, error=str(exc))
