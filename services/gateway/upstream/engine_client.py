"""The pick, generate and stream steps: the router picks a replica, the engine streams.

An attempt
that failed before its first token is tried on another replica (at most
max_attempts, never one whose circuit breaker is open) only when its code
says the replica is at fault (RETRYABLE) and the request never reached an
engine step: the engine says when it schedules a request, in initial
metadata (common/engine_metadata.py). A request that reached a step may be
what broke it, so it is not sent on to break another replica; one that was
refused, queued, or never delivered cannot be. An engine that fails under a
request (before or after its first token) is migrated instead, within its
limit: resumed on another replica with the tokens already delivered
(migration.py); a broken stream that cannot migrate ends with finish_reason
"error". The router is told of such a failure at once (Release with success
false), so it stops picking the replica before its own poll would. The client bills nothing:
each request's EngineStream ends with a Tally of what the engine computed and
delivered, which the request's Run (run.py) bills. The router is not told of
a request's end: its pick counts until the replica's next load report (router/endpoints.py).

A request cut short before its first token is not free: its prompt may be
most of the work. Whatever cut it (the client gone, the first-token timeout),
its engine request is stopped with Abort rather than a cancel, so the stream
stays open to bring the abort's report of the prompt tokens the engine
computed (cache hits included, as on every request; the vLLM backend reports
the prompt's length, docs/billing.md), which are tallied with no completion
tokens: none was delivered. For a client gone, the report is read in a task of
its own (the request's task is cancelled), which EngineStream.tally awaits. A
timed-out attempt the gateway retries on another replica is not tallied: the
request is billed once, for the attempt it ended with.

A request naming a LoRA adapter carries it to the router (PickRequest.adapter:
replicas with it loaded are preferred) and the engine (GenerateRequest.adapter).
A replica that answers NOT_FOUND lacks it: for an adapter the routing table
lists, the replica is asked to load it, within the tenant's bounds
(adapter_loads.py), and the request is sent there again, once; so is a
migration's resume.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from maas.v1 import engine_pb2, router_pb2
from maas_services.common import serves
from maas_services.common.engine_metadata import was_scheduled
from maas_services.common.finish_reasons import FINISH_NAMES
from maas_services.common.logging import get_logger
from maas_services.common.openai_api.delta import Delta
from maas_services.common.openai_api.errors import APIError, from_upstream
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.gateway.background import Background
from maas_services.gateway.routing.routing_table import Route
from maas_services.gateway.ticket import Ticket
from maas_services.gateway.upstream.adapter_loads import AdapterLoads
from maas_services.gateway.upstream.circuit_breaker import Breakers
from maas_services.gateway.upstream.engine_mux import MuxCall
from maas_services.gateway.upstream.migration import (
    MIGRATABLE,
    MIGRATIONS,
    NO_REPLICA,
    RESUME_FAILED,
    RESUMED,
    MigrationPolicy,
    Migrations,
)
from maas_services.gateway.upstream.prompt_encoder import Prompt
from maas_services.gateway.upstream.upstreams import Upstreams

log = get_logger(__name__)

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
# Waiting for a replica to migrate to: the first and the longest pause between Picks.
HOLD_POLL_SECONDS = (0.05, 1.0)
# How long a pick sent during admission (EarlyPick) stays good for the first
# attempt: the router's load report period (router settings' poll_interval_seconds,
# 0.5 s). Until the replica's next report the router counts the pick and chose it
# on loads at most a period old; after it, the report shows loads the pick never
# saw and the router no longer counts it, so a request admitted later (it waited
# in the fair queue) picks again, on fresh loads, and is counted once.
EARLY_PICK_SECONDS = 0.5


@dataclass
class Tally:
    """What an engine stream computed and delivered: what its request is billed.

    `endpoint` is the replica the request ended on; the times are wall-clock
    seconds (0.0: no token was delivered). `migration_prefill_tokens`: what
    its migrations sent again to be prefilled, the platform's cost (migration.py).
    """

    prompt_tokens: int
    endpoint: str = ""
    started_at: float = 0.0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    finish: str = ""
    first_token_at: float = 0.0
    ended_at: float = 0.0
    migration_prefill_tokens: int = 0

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


class EarlyPick:
    """The first attempt's pick, sent once the prompt is tokenized, while the
    request's reserve trip and fair queue run (pipeline.py).

    A request that fails admission cancels it. If the router answered, that
    pick counts at its replica until the replica's next load report, as a
    request that ended at once does, and the router is told nothing: it ignores
    Release(success=true), and success=false would stop its picks of a replica
    that did not fail (docs/router.md).
    """

    def __init__(self, task: asyncio.Task):
        self._task = task
        self._sent = time.monotonic()

    def cancel(self) -> None:
        self._task.cancel()

    async def answer(self, blocked: list[str]) -> router_pb2.PickResponse | None:
        """The pick while it is good (EARLY_PICK_SECONDS, an endpoint whose
        breaker is closed); None: pick again."""
        if time.monotonic() - self._sent > EARLY_PICK_SECONDS:
            self._task.cancel()
            return None
        pick = await self._task
        return None if pick is None or pick.endpoint_id in blocked else pick


class EngineStream:
    """One request's engine work: its deltas as they come, then its tally.

    `cut_short`: the request ended before its first token with a report of the
    prefill it caused (Aborted: the client gone, or the first-token timeout);
    nothing more goes to its client, so it may be billed at once.
    """

    def __init__(self, client: "EngineClient", ticket: Ticket):
        self.cut_short = False
        # An embedding request's vector, from the engine's one message (its own container).
        self.embedding: Sequence[float] = ()
        # The tally once known; a task while the engine's report is awaited.
        self._tally: Tally | asyncio.Task | None = None
        # The engine call being read (a migration's replaces the failed one).
        self.call = None
        self.deltas: AsyncIterator[Delta] = client._generate(ticket, self)

    def ready(self) -> bool:
        """Whether the call's next message is here already; a GenerateMany call
        can tell (engine_mux.MuxCall), a call of its own cannot: False."""
        return isinstance(self.call, MuxCall) and self.call.ready()

    async def tally(self) -> Tally | None:
        """What to bill; None when no engine computed anything for the request."""
        if isinstance(self._tally, asyncio.Task):
            (result,) = await asyncio.gather(self._tally, return_exceptions=True)
            return result if isinstance(result, Tally) else None
        return self._tally

    def known_tally(self) -> Tally | None:
        """The tally if already known, without waiting for an engine's report."""
        return self._tally if isinstance(self._tally, Tally) else None

    def reported(self, report: Tally | asyncio.Task) -> None:
        self._tally, self.cut_short = report, True

    def ended(self, tally: Tally) -> None:
        self._tally = tally


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
        report: Tally | None = None,
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
        timeouts: Timeouts,
        breakers: Breakers,
        max_attempts: int,
        background: Background,
        migration: MigrationPolicy,
        adapters: AdapterLoads,
    ):
        self._up = upstreams
        self._timeouts = timeouts
        self._breakers = breakers
        self._max_attempts = max_attempts
        self._background = background
        self._migration = migration
        self._adapters = adapters

    def pick_early(
        self, request: ParsedRequest, route: Route, prompt: Prompt, tenant: str
    ) -> EarlyPick:
        """Send the first attempt's pick now (EarlyPick); the Ticket carries it."""
        exclude = sorted(self._breakers.blocked())
        pick = pick_request(request, route, prompt.token_ids, tenant, exclude)
        return EarlyPick(asyncio.ensure_future(self._early_pick(pick)))

    async def _early_pick(self, request: router_pb2.PickRequest) -> router_pb2.PickResponse | None:
        try:
            return await self._up.router.Pick(request, timeout=10)
        except grpc.aio.AioRpcError:
            # The first attempt picks again: its error, if it fails too, is the client's.
            return None

    def open(self, ticket: Ticket) -> EngineStream:
        """The request's engine stream; nothing is sent before its deltas are read."""
        return EngineStream(self, ticket)

    async def _first_message(
        self,
        ticket: Ticket,
        stream: EngineStream,
        started: float,
        deadline: float,
        migrations: Migrations,
    ):
        """(pick, call, first message) of the first attempt that answers; the
        client's error when none does, with the report of the prefill of the
        attempt the request ended with (module docstring). An attempt that
        failed in a step is migrated (with nothing to resume) within the limit."""
        tried: list[str] = []
        failure: EngineFailedError | None = None
        attempts, migrating = 0, False
        # The replica that has just loaded the request's adapter, to send it to again.
        again: router_pb2.PickResponse | None = None
        adapter_loaded = False
        try:
            while True:
                if again is not None:
                    pick, again = again, None
                elif not attempts and ticket.pick is not None:
                    pick = await ticket.pick.answer(self._breakers.blocked())
                    pick = pick or await self._pick(ticket, tried, failure)
                elif not migrating:
                    pick = await self._pick(ticket, tried, failure)
                else:
                    pick = await self._migration_pick(ticket, tried, failure, deadline)
                    if pick is None:
                        raise failure.error
                    migrations.started(len(ticket.prompt.token_ids), 0)
                attempts += 1
                sent = time.monotonic()
                try:
                    answer = await self._start(ticket, stream, pick, deadline, started)
                    if migrating:
                        MIGRATIONS.labels(RESUMED).inc()
                    return pick, *answer
                except EngineFailedError as exc:
                    if self._adapter_missing(ticket, exc) and not adapter_loaded:
                        await self._adapters.load(ticket.principal.tenant, ticket.route, pick, sent)
                        # Not an attempt of its own: the same one, now that it can run.
                        again, adapter_loaded, attempts = pick, True, attempts - 1
                        continue
                    tried.append(pick.endpoint_id)
                    failure = exc
                    if exc.code in MIGRATABLE:
                        self._tell_router(ticket, pick)
                    if exc.retryable and attempts < self._max_attempts:
                        continue
                    migrating = exc.scheduled and exc.code in MIGRATABLE
                    if not migrating or not self._may_migrate(ticket, migrations, exc.code):
                        break
            raise failure.error
        except BaseException:
            # A client gone during an attempt leaves that attempt's report (_start).
            if failure is not None and failure.report is not None and not stream.cut_short:
                stream.reported(failure.report)
            raise

    @staticmethod
    def _adapter_missing(ticket: Ticket, exc: EngineFailedError) -> bool:
        """The replica lacks the request's adapter, which the gateway may load."""
        return exc.code == grpc.StatusCode.NOT_FOUND and bool(ticket.route.adapter_source)

    async def _start(
        self,
        ticket: Ticket,
        stream: EngineStream,
        pick: router_pb2.PickResponse,
        deadline: float,
        started: float,
        resume: list[int] | None = None,
    ):
        """Open the engine stream and wait for its first message (connect and
        first-token timeouts); a failure is charged to the endpoint's breaker.
        `resume`: a migrated request's delivered tokens (migration.py)."""
        self._breakers.begin(pick.endpoint_id)
        call = reading = None
        try:
            await self._up.wait_connected(pick.address, pick.endpoint_id, self._timeouts.connect)
            call = await self._up.generate(
                pick.address,
                pick.endpoint_id,
                engine_pb2.GenerateRequest(
                    request_id=ticket.request.request_id,
                    model=ticket.route.deployment,
                    prompt_token_ids=ticket.prompt.token_ids,
                    sampling=ticket.sampling,
                    priority=ticket.route.tier.priority,
                    tenant=ticket.principal.tenant.name,
                    share_prefix_cache=ticket.route.share_prefix_cache,
                    resume_token_ids=resume,
                    adapter=ticket.route.adapter,
                ),
                max(deadline - time.monotonic(), 0.001),
                self._timeouts.connect,
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
            report = await self._report(ticket, pick, call, reading, started)
            report.finish = "first_token_timeout"
            # The call has ended, so this answers at once with what arrived.
            scheduled = was_scheduled(await call.initial_metadata())
            raise EngineFailedError(error, code, scheduled, report) from exc
        except EngineFailedError as exc:
            self._failed(ticket, pick, call, exc.code)
            raise
        except BaseException:
            # The client went away while we waited: not the engine's fault.
            if reading is not None and resume is None:
                stream.reported(
                    self._background.run(self._abandon(ticket, pick, call, reading, started))
                )
            elif call is not None:
                # A resume's prefill is the platform's: its tally is the stream's.
                call.cancel()
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

    async def _generate(self, ticket: Ticket, stream: EngineStream) -> AsyncIterator[Delta]:
        """Stream deltas; errors before the first token raise APIError.

        A stream that breaks after tokens were sent migrates (migration.py) and
        goes on from the new replica's first message, or ends with a delta whose
        finish_reason is "error"; what was generated is still tallied. One
        generator from the first message to the last: every generator layer
        costs each streamed token a resume."""
        started = time.time()
        deadline = time.monotonic() + self._timeouts.total
        migrations = Migrations(self._migration)
        pick, call, response = await self._first_message(
            ticket, stream, started, deadline, migrations
        )
        tally = Tally(len(ticket.prompt.token_ids), pick.endpoint_id, started)
        # Every token id the client has been sent: what a migration resumes from.
        delivered: list[int] = []
        stream.call = call
        try:
            while response is not grpc.aio.EOF:
                tally.add(response)
                if response.embedding:
                    stream.embedding = response.embedding
                delivered.extend(response.token_ids)
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
                try:
                    response = await call.read()
                except grpc.aio.AioRpcError as exc:
                    log.warning(
                        "engine_stream_broken",
                        request_id=ticket.request.request_id,
                        endpoint=pick.endpoint_id,
                        code=exc.code().name,
                    )
                    call.cancel()
                    resumed = await self._migrate(
                        ticket, stream, pick, exc.code(), delivered, started, deadline, migrations
                    )
                    tally.migration_prefill_tokens = migrations.prefill_tokens
                    if resumed is None:
                        tally.finish = "error"
                        yield Delta(
                            text="",
                            finish_reason="error",
                            prompt_tokens=tally.prompt_tokens,
                            completion_tokens=tally.completion_tokens,
                            cached_prompt_tokens=tally.cached_prompt_tokens,
                        )
                        return
                    pick, call, response = resumed
                    stream.call = call
                    tally.endpoint = pick.endpoint_id
        finally:
            # First thing on a client disconnect: the engine frees the
            # request's KV blocks as soon as it sees the cancellation.
            call.cancel()
            tally.migration_prefill_tokens = migrations.prefill_tokens
            tally.ended_at = time.time()
            stream.ended(tally)

    async def _migrate(
        self,
        ticket: Ticket,
        stream: EngineStream,
        failed,
        code: grpc.StatusCode,
        delivered: list[int],
        started: float,
        deadline: float,
        migrations: Migrations,
    ):
        """Resume a request whose engine failed mid-stream on another replica:
        (pick, call, first message), or None when it cannot (migration.py)."""
        if code in MIGRATABLE:
            self._failed(ticket, failed, None, code)  # the replica's breaker counts it
        tried = [failed.endpoint_id]
        while True:
            if code in MIGRATABLE:
                self._tell_router(ticket, failed)
            if not self._may_migrate(ticket, migrations, code):
                return None
            pick = await self._migration_pick(ticket, tried, None, deadline)
            if pick is None:
                return None
            migrations.started(len(ticket.prompt.token_ids), len(delivered))
            try:
                call, first = await self._resume(ticket, stream, pick, deadline, started, delivered)
            except EngineFailedError as exc:
                tried.append(pick.endpoint_id)
                failed, code = pick, exc.code
                if code not in MIGRATABLE:
                    MIGRATIONS.labels(RESUME_FAILED).inc()
                    return None
                continue
            MIGRATIONS.labels(RESUMED).inc()
            log.info(
                "request_migrated",
                request_id=ticket.request.request_id,
                endpoint=pick.endpoint_id,
                resumed_tokens=len(delivered),
                migrations=migrations.count,
            )
            return pick, call, first

    async def _resume(
        self,
        ticket: Ticket,
        stream: EngineStream,
        pick: router_pb2.PickResponse,
        deadline: float,
        started: float,
        delivered: list[int],
    ):
        """A migration's start on `pick`; a replica that lacks the request's adapter
        loads it first, within the tenant's bounds (a load refused: the resume is)."""
        sent = time.monotonic()
        try:
            return await self._start(ticket, stream, pick, deadline, started, list(delivered))
        except EngineFailedError as exc:
            if not self._adapter_missing(ticket, exc):
                raise
            try:
                await self._adapters.load(ticket.principal.tenant, ticket.route, pick, sent)
            except APIError:
                raise exc from None
        return await self._start(ticket, stream, pick, deadline, started, list(delivered))

    async def _migration_pick(
        self, ticket: Ticket, tried: list[str], failure, deadline: float
    ) -> router_pb2.PickResponse | None:
        """Another replica for a migration, waiting up to the hold's timeout for
        one; None (counted) when none comes."""
        try:
            return await self._pick(ticket, tried, failure, self._migration.hold_seconds, deadline)
        except APIError:
            MIGRATIONS.labels(NO_REPLICA).inc()
            log.warning("migration_no_replica", request_id=ticket.request.request_id)
            return None

    def _may_migrate(self, ticket: Ticket, migrations: Migrations, code) -> bool:
        """Whether a failure with `code` may migrate; a refusal is counted."""
        why = migrations.refusal(code, ticket.request.n)
        if why is None:
            return True
        MIGRATIONS.labels(why).inc()
        return False

    def _tell_router(self, ticket: Ticket, failed) -> None:
        """The router stops picking the replica now, not at its next poll."""

        async def tell() -> None:
            try:
                await self._up.router.Release(
                    router_pb2.ReleaseRequest(
                        request_id=ticket.request.request_id,
                        endpoint_id=failed.endpoint_id,
                        success=False,
                    ),
                    timeout=2,
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("router_not_told", endpoint=failed.endpoint_id, code=exc.code().name)

        self._background.run(tell())

    async def _abandon(
        self, ticket: Ticket, pick, call, reading: asyncio.Future, started: float
    ) -> Tally:
        """Abort a request whose client left before its first token; what the
        engine reports having computed (module docstring)."""
        report = await self._report(ticket, pick, call, reading, started)
        if report.finish in ("", "abort"):
            report.finish = "client_disconnect"
        return report

    async def _report(
        self, ticket: Ticket, pick, call, reading: asyncio.Future, started: float
    ) -> Tally:
        """Stop a request before its first token with Abort and read the engine's
        report of the prompt it computed; the call is cancelled at the end."""
        # No report, nothing to bill: the engine may not have started it.
        tally = Tally(0, pick.endpoint_id, started)
        try:
            async with asyncio.timeout(ABORT_SECONDS):
                await self._up.engine(pick.address, pick.endpoint_id).Abort(
                    engine_pb2.AbortRequest(request_id=ticket.request.request_id)
                )
                response = await reading
                if response is not grpc.aio.EOF:
                    tally.prompt_tokens = len(ticket.prompt.token_ids)
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
        tally.ended_at = time.time()
        return tally

    async def _pick(
        self,
        ticket: Ticket,
        tried: list[str],
        failure: EngineFailedError | None,
        hold: float = 0.0,
        deadline: float = 0.0,
    ) -> router_pb2.PickResponse:
        """The router's pick. With `hold` (a migration's), while no replica is
        left, ask again for up to `hold` seconds, within the request's deadline."""
        until = min(time.monotonic() + hold, deadline) if hold else 0.0
        pause, longest = HOLD_POLL_SECONDS
        while True:
            request = pick_request(
                ticket.request,
                ticket.route,
                ticket.prompt.token_ids,
                ticket.principal.tenant.name,
                sorted({*tried, *self._breakers.blocked()}),
            )
            try:
                return await self._up.router.Pick(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                none_left = exc.code() == grpc.StatusCode.UNAVAILABLE
                if not none_left or time.monotonic() + pause > until:
                    # Out of replicas to retry on: the engine's own error says more.
                    if failure is not None and none_left:
                        raise failure.error from exc
                    raise from_upstream(exc, ticket.request.model) from exc
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)


def pick_request(
    request: ParsedRequest,
    route: Route,
    token_ids: Sequence[int],
    tenant: str,
    exclude: list[str],
) -> router_pb2.PickRequest:
    """What the router is asked, for the first pick (sent early or not) and every later one."""
    return router_pb2.PickRequest(
        request_id=request.request_id,
        model=route.deployment,
        token_ids=token_ids,
        tenant=tenant,
        session_id=request.session_id,
        exclude_endpoint_ids=exclude,
        share_prefix_cache=route.share_prefix_cache,
        serve=serves.EMBED if request.sampling.HasField("embedding") else serves.GENERATE,
        adapter=route.adapter,
    )
