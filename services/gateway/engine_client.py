"""The pick, generate and stream steps: the router picks a replica, the engine streams.

An attempt
that failed before its first token is tried on another replica (at most
max_attempts, never one whose circuit breaker is open) only when its code
says the replica is at fault (RETRYABLE) and the request never reached an
engine step: the engine says when it schedules a request, in initial
metadata (common/engine_metadata.py). A request that reached a step may be
what broke it, so it is not sent on to break another replica; one that was
refused, queued, or never delivered cannot be. After the first token a
broken stream ends with finish_reason "error". On the way out the usage
event is published in a task of its own, so a client disconnect (which
cancels the stream) cannot cancel billing. The router is not told of the
end: its pick counts until the replica's next load report (router/endpoints.py).

A request cut short before its first token is not free: its prompt may be
most of the work. Whatever cut it (the client gone, the first-token timeout),
its engine request is stopped with Abort rather than a cancel, so the stream
stays open to bring the abort's report of the prompt tokens the engine
computed (cache hits included, as on every request; the vLLM backend reports
the prompt's length, docs/billing.md), which are billed with no completion
tokens: none was delivered. Ticket.abandoned is the task that bills it, and
its result the usage event, for the pipeline to settle the tenant's TPM to. A
timed-out attempt the gateway retries on another replica is not billed: the
request is billed once, for the attempt it ended with.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from maas.v1 import common_pb2, engine_pb2, router_pb2
from services.common.engine_metadata import was_scheduled
from services.common.logging import get_logger
from services.common.tracing import current_traceparent
from services.common.usage_event import UsageEvent
from services.gateway.background import Background
from services.gateway.circuit_breaker import Breakers
from services.gateway.delta import Delta
from services.gateway.errors import APIError, from_upstream
from services.gateway.rate_limiter import Settlement
from services.gateway.ticket import Ticket
from services.gateway.upstreams import Upstreams
from services.gateway.usage_emitter import UsageEmitter

log = get_logger(__name__)

FINISH_NAMES = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
}
# Worth another replica, unless the request reached a step: the engine is
# down, overloaded, slow or broke. A request the engine blames on itself
# (INVALID_ARGUMENT, also for one that made a step raise) is never retried.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
}
# Counted against the endpoint's breaker; an overloaded engine is healthy.
BREAKING = RETRYABLE - {grpc.StatusCode.RESOURCE_EXHAUSTED}
# For the Abort of a request whose client left, and the engine's report after
# it: at most a model step away.
ABORT_SECONDS = 10.0


@dataclass
class Tally:
    """What an engine stream delivered, counted as it is billed."""

    prompt_tokens: int
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    finish: str = ""
    first_token_at: float = 0.0

    def add(self, response: engine_pb2.GenerateResponse) -> None:
        self.completion_tokens += len(response.token_ids)
        if response.token_ids and not self.first_token_at:
            self.first_token_at = time.time()
        self.finish = FINISH_NAMES.get(response.finish_reason, "")
        if response.HasField("usage"):
            if self.finish == "abort" and not self.completion_tokens:
                # Aborted in prefill: only what the engine computed.
                self.prompt_tokens = response.computed_prompt_tokens
            self.cached_prompt_tokens = min(response.usage.cached_prompt_tokens, self.prompt_tokens)


@dataclass(frozen=True)
class Timeouts:
    connect: float
    first_token: float
    total: float


class EngineFailedError(Exception):
    """An attempt failed before any token; `error` is what the client would see.

    `scheduled`: the engine had put the request into a model step. `report`:
    for an attempt stopped with Abort (a first-token timeout), what the engine
    computed, billed if the request ends with this attempt.
    """

    def __init__(
        self,
        error: APIError,
        code: grpc.StatusCode,
        scheduled: bool = False,
        report: tuple[router_pb2.PickResponse, Tally] | None = None,
    ):
        super().__init__(error.message)
        self.error, self.code, self.scheduled, self.report = error, code, scheduled, report

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE and not self.scheduled


class EngineClient:
    def __init__(
        self,
        upstreams: Upstreams,
        usage: UsageEmitter,
        timeouts: Timeouts,
        breakers: Breakers,
        max_attempts: int,
        background: Background,
    ):
        self._up = upstreams
        self.usage = usage
        self._timeouts = timeouts
        self._breakers = breakers
        self._max_attempts = max_attempts
        self._background = background

    async def generate(self, ticket: Ticket) -> AsyncIterator[Delta]:
        """Stream deltas; errors before the first token raise APIError.

        A stream that breaks after tokens were sent ends with a delta whose
        finish_reason is "error"; what was generated is still billed.
        """
        started = time.time()
        pick, call, first = await self._first_message(ticket, started)
        async for delta in self._stream(ticket, pick, call, first, started):
            yield delta

    async def _first_message(self, ticket: Ticket, started: float):
        """(pick, call, first message) of the first attempt that answers; the
        client's error when none does, once the prefill of the attempt the
        request ended with is billed (module docstring)."""
        deadline = time.monotonic() + self._timeouts.total
        tried: list[str] = []
        failure: EngineFailedError | None = None
        try:
            for _ in range(self._max_attempts):
                pick = await self._pick(ticket, tried, failure)
                try:
                    return pick, *await self._start(ticket, pick, deadline, started)
                except EngineFailedError as exc:
                    tried.append(pick.endpoint_id)
                    failure = exc
                    if not exc.retryable:
                        break
            raise failure.error
        except BaseException:
            # A client gone during an attempt leaves that attempt's bill (abandoned).
            if failure is not None and failure.report is not None and ticket.abandoned is None:
                ticket.abandoned = self._background.run(
                    self._bill_report(ticket, *failure.report, started)
                )
            raise

    async def _start(
        self, ticket: Ticket, pick: router_pb2.PickResponse, deadline: float, started: float
    ):
        """Open the engine stream and wait for its first message (connect and
        first-token timeouts); a failure is charged to the endpoint's breaker."""
        self._breakers.begin(pick.endpoint_id)
        call = reading = None
        try:
            await self._up.wait_connected(pick.address, pick.endpoint_id, self._timeouts.connect)
            call = self._up.engine(pick.address, pick.endpoint_id).Generate(
                engine_pb2.GenerateRequest(
                    request_id=ticket.request.request_id,
                    model=ticket.route.deployment,
                    prompt_token_ids=ticket.prompt.token_ids,
                    sampling=ticket.sampling,
                    priority=ticket.route.tier.priority,
                    tenant=ticket.principal.tenant.name,
                    share_prefix_cache=ticket.route.share_prefix_cache,
                ),
                timeout=max(deadline - time.monotonic(), 0.001),
            )
            reading = asyncio.ensure_future(call.read())
            first = await self._up.first_message(
                reading, pick.endpoint_id, self._timeouts.first_token
            )
            if first is grpc.aio.EOF:
                raise EngineFailedError(
                    APIError(502, "the model ended without output", "api_error", "upstream_error"),
                    grpc.StatusCode.INTERNAL,
                    was_scheduled(await call.initial_metadata()),
                )
        except grpc.aio.AioRpcError as exc:
            self._failed(ticket, pick, call, exc.code())
            raise EngineFailedError(
                from_upstream(exc, ticket.request.model),
                exc.code(),
                was_scheduled(exc.initial_metadata()),
            ) from exc
        except TimeoutError as exc:
            stage = "connect" if call is None else "first token"
            error = APIError(
                504, f"the model did not answer in time ({stage})", "timeout", "timeout"
            )
            code = grpc.StatusCode.DEADLINE_EXCEEDED
            if call is None:
                self._failed(ticket, pick, call, code)
                raise EngineFailedError(error, code) from exc
            # Not cancelled: stopped with Abort, the engine reports the prefill it did.
            self._failed(ticket, pick, None, code)
            report = await self._report(ticket, pick, call, reading)
            report.finish = "first_token_timeout"
            # The call has ended, so this answers at once with what arrived.
            scheduled = was_scheduled(await call.initial_metadata())
            raise EngineFailedError(error, code, scheduled, (pick, report)) from exc
        except EngineFailedError as exc:
            self._failed(ticket, pick, call, exc.code)
            raise
        except BaseException:
            # The client went away while we waited: not the engine's fault.
            if reading is not None:
                ticket.abandoned = self._background.run(
                    self._abandon(ticket, pick, call, reading, started)
                )
            raise
        self._breakers.succeeded(pick.endpoint_id)
        return call, first

    def _failed(self, ticket: Ticket, pick, call, code: grpc.StatusCode) -> None:
        if call is not None:
            call.cancel()  # ends its pending read too
        if code in BREAKING:
            self._breakers.failed(pick.endpoint_id)
        log.warning(
            "engine_attempt_failed",
            request_id=ticket.request.request_id,
            endpoint=pick.endpoint_id,
            code=code.name,
        )

    async def _stream(self, ticket: Ticket, pick, call, first, started: float):
        tally = Tally(len(ticket.prompt.token_ids))
        response = first
        try:
            while response is not grpc.aio.EOF:
                tally.add(response)
                yield Delta(
                    text=response.text,
                    index=response.index,
                    finish_reason=tally.finish or None,
                    prompt_tokens=tally.prompt_tokens,
                    completion_tokens=tally.completion_tokens,
                    cached_prompt_tokens=tally.cached_prompt_tokens,
                    # The message's own container: no copy per token.
                    logprobs=response.logprobs,
                )
                response = await call.read()
        except grpc.aio.AioRpcError as exc:
            tally.finish = "error"
            log.warning(
                "engine_stream_broken", request_id=ticket.request.request_id, code=exc.code().name
            )
            yield Delta(
                text="",
                finish_reason="error",
                prompt_tokens=tally.prompt_tokens,
                completion_tokens=tally.completion_tokens,
                cached_prompt_tokens=tally.cached_prompt_tokens,
            )
        finally:
            # First thing on a client disconnect: the engine frees the
            # request's KV blocks as soon as it sees the cancellation.
            call.cancel()
            self._bill(ticket, pick, tally, started, after_delivery=True)

    async def _abandon(
        self, ticket: Ticket, pick, call, reading: asyncio.Future, started: float
    ) -> UsageEvent:
        """Abort a request whose client left before its first token, and bill
        what the engine reports having computed (module docstring)."""
        report = await self._report(ticket, pick, call, reading)
        if report.finish in ("", "abort"):
            report.finish = "client_disconnect"
        return self._bill(ticket, pick, report, started)

    async def _bill_report(self, ticket: Ticket, pick, report: Tally, started: float) -> UsageEvent:
        """_bill as a task's result, for Ticket.abandoned."""
        return self._bill(ticket, pick, report, started)

    async def _report(self, ticket: Ticket, pick, call, reading: asyncio.Future) -> Tally:
        """Stop a request before its first token with Abort and read the engine's
        report of the prompt it computed; the call is cancelled at the end."""
        tally = Tally(0)  # no report, no bill: the engine may not have started it
        try:
            async with asyncio.timeout(ABORT_SECONDS):
                await self._up.engine(pick.address, pick.endpoint_id).Abort(
                    engine_pb2.AbortRequest(request_id=ticket.request.request_id)
                )
                response = await reading
                if response is not grpc.aio.EOF:
                    tally = Tally(len(ticket.prompt.token_ids))
                while response is not grpc.aio.EOF:
                    tally.add(response)
                    response = await call.read()
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            log.warning(
                "engine_abort_unreported", request_id=ticket.request.request_id, error=repr(exc)
            )
        finally:
            call.cancel()
        # Cut short before its first token, the request delivered none: what the
        # engine generated after the cut is not billed (docs/billing.md).
        tally.completion_tokens, tally.first_token_at = 0, 0.0
        return tally

    def _bill(
        self, ticket: Ticket, pick, tally: Tally, started: float, after_delivery: bool = False
    ) -> UsageEvent:
        """The request's usage event, published in a task: for a stream that
        reached its client, once the response is out."""
        event = UsageEvent(
            request_id=ticket.request.request_id,
            tenant=ticket.principal.tenant.name,
            key_id=ticket.principal.key_id,
            model=ticket.request.model,
            deployment=ticket.route.deployment,
            endpoint=pick.endpoint_id,
            prompt_tokens=tally.prompt_tokens,
            cached_prompt_tokens=tally.cached_prompt_tokens,
            completion_tokens=tally.completion_tokens,
            finish_reason=tally.finish or "client_disconnect",
            started_at=started,
            ttft_seconds=max(0.0, tally.first_token_at - started) if tally.first_token_at else 0.0,
            duration_seconds=time.time() - started,
            traceparent=current_traceparent(),
        )
        if after_delivery:
            # A stream that started: the pipeline leaves its settlement to its bill.
            settlement = ticket.settlement(event.prompt_tokens + event.completion_tokens)
            self._background.after(ticket.delivered, self._finish(event, ticket, settlement))
        else:
            self._background.run(self._finish(event, ticket))
        return event

    async def _pick(
        self, ticket: Ticket, tried: list[str], failure: EngineFailedError | None
    ) -> router_pb2.PickResponse:
        request = router_pb2.PickRequest(
            request_id=ticket.request.request_id,
            model=ticket.route.deployment,
            token_ids=ticket.prompt.token_ids,
            tenant=ticket.principal.tenant.name,
            session_id=ticket.request.session_id,
            exclude_endpoint_ids=sorted({*tried, *self._breakers.blocked()}),
            share_prefix_cache=ticket.route.share_prefix_cache,
        )
        try:
            return await self._up.router.Pick(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            # Out of replicas to retry on: the engine's own error says more.
            if failure is not None and exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise failure.error from exc
            raise from_upstream(exc, ticket.request.model) from exc

    async def _finish(
        self, event: UsageEvent, ticket: Ticket, settlement: Settlement | None = None
    ) -> None:
        reservation = ticket.reservation
        if event.prompt_tokens or event.completion_tokens:
            # The balance's hold settles to the real cost ahead of the event;
            # billing's commit of the event then drops it.
            held = reservation.settlement(event) if reservation is not None else None
            await self.usage.emit(event, settlement, held)
            return
        if settlement is not None:
            await settlement.answered(None)
        if reservation is not None:
            await reservation.release()
