"""From an authenticated principal and a parsed request to engine deltas, for both fronts.

Pipeline.complete runs the steps in order:
1. limits pre-check: key caps (400), quota, RPM and concurrency, counted
   before any work is done for the request (for a tenant the limiter last
   admitted, in step 4 instead, with its tokens: rate_limiter.py);
2. resolve route: the model name (alias, canary, tier) -> a running deployment,
   or one scaled to zero;
3. tokenize (prompt_encoder.py);
4. admit: reserve prompt + max_tokens against the tenant's TPM and, for a
   prepaid tenant, their most cost against its balance (quota_gate.py), hold while a
   deployment scaled to zero starts a replica (cold_start_hold.py), then wait
   for a fair share of the deployment's slots (deployment_queues.py);
and returns a Completion whose deltas, as they are read, run
5. pick and 6. generate (engine_client.py, retries included),
7. stream, through the output filter,
8. settle: free the slots and settle the tenant's tokens to what was really
   used (for a client that left before the first token: the prompt tokens
   the engine computed and billed, see engine_client.py); for a stream that
   started, in the round trip of its usage event (usage_emitter.py), which
   also settles the balance hold to the real cost; a request with nothing to
   bill releases its hold.

A request that passed the limiter counts toward the tenant's RPM even if it
then fails (an unknown model, a prompt too long for the context, queue full,
engine error); its concurrency lease ends and its tokens are settled to what
it used. A request with n sequences costs n: of the tenant's concurrency, and
of the deployment's slots in the fair queue.
"""

import asyncio
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from maas.v1 import engine_pb2, router_pb2
from services.common.usage_event import UsageEvent
from services.gateway.background import Background
from services.gateway.cold_start_hold import ColdStartHold, ready
from services.gateway.delta import Delta
from services.gateway.deployment_queues import DeploymentQueues
from services.gateway.engine_client import EngineClient
from services.gateway.errors import APIError, bad_request, dropped, model_not_found, unavailable
from services.gateway.fair_queue import FairShareError, QueueFullError, QueueTimeoutError
from services.gateway.model_catalog import ModelCatalog
from services.gateway.output_filter import OutputFilter
from services.gateway.parsed_request import ParsedRequest
from services.gateway.prompt_encoder import PromptEncoder
from services.gateway.quota_gate import QuotaGate, Reservation
from services.gateway.rate_limiter import RateLimiter
from services.gateway.routes_watcher import RoutesWatcher
from services.gateway.routing_table import NoDeploymentUpError, Route
from services.gateway.tenants import Principal, Tenant
from services.gateway.ticket import Ticket


@dataclass
class Completion:
    """An admitted request and its deltas; errors before the first delta raise APIError."""

    ticket: Ticket
    deltas: AsyncIterator[Delta]

    @property
    def headers(self) -> dict[str, str]:
        return self.ticket.headers

    def delivered(self) -> None:
        """The front's word that the response is out: the request's owed work may run."""
        self.ticket.delivered.set()


@dataclass
class Pipeline:
    encoder: PromptEncoder
    engine: EngineClient
    catalog: ModelCatalog
    limiter: RateLimiter
    routes: RoutesWatcher
    queues: DeploymentQueues
    output_filter: OutputFilter
    quotas: QuotaGate
    background: Background
    hold: ColdStartHold

    async def models(self, tenant: Tenant | None = None) -> list[str]:
        """Names a tenant may send now (every name when tenant is None)."""
        tier = tenant.tier if tenant else None
        names = self.routes.table.names(set(await self._deployments()), tier)
        return [n for n in names if tenant is None or tenant.may_use(n)]

    async def complete(self, principal: Principal, request: ParsedRequest) -> Completion:
        ticket = await self._admit(principal, request)
        return Completion(ticket, self._stream(ticket))

    async def _admit(self, principal: Principal, request: ParsedRequest) -> Ticket:
        tenant = principal.tenant
        check_caps(request, tenant)
        floor = request.n * (request.max_tokens or 1)
        # Before the quota's Redis round trip: a tenant refused for RPM is
        # refused until its Retry-After, whatever its quota says.
        self.limiter.refuse_blocked(tenant, floor)
        await self.quotas.check(tenant.name)
        counted = self.limiter.counts_first(tenant)
        if counted:
            try:
                limits = await self.limiter.admit(tenant, request.request_id, floor, request.n)
            except asyncio.CancelledError:
                # Cancelled in flight (a client gone, a cancelled call), the script
                # may have run with its reply unread: give back what it may have taken.
                self._settle(tenant, request, 0)
                raise
        reservation = self.quotas.reservation(tenant.name, request.request_id)
        try:
            deployments = await self._deployments()
            route = self._route(request, tenant, set(deployments))
            prompt = await self.encoder.encode(route.tokenizer, request.prompt, request.max_tokens)
            if request.sampling.HasField("grammar"):
                await self.encoder.check_grammar(
                    route.tokenizer, request.sampling.grammar, request.grammar_param, tenant.name
                )
            room = max(prompt.max_model_len - len(prompt.token_ids), 1)
            max_tokens = request.max_tokens or min(tenant.max_tokens or room, room)
            need = len(prompt.token_ids) + request.n * max_tokens
            if counted:
                limits = await self.limiter.reserve(limits, request.request_id, need)
            else:
                # Whatever it answers, the request has been counted or refused.
                counted = True
                limits = await self.limiter.admit(
                    tenant, request.request_id, floor, request.n, need
                )
            await reservation.take(route.deployment, len(prompt.token_ids), request.n * max_tokens)
            if route.scales_to_zero and not ready(deployments.get(route.deployment)):
                # Before the queue, which is sized from the replicas that are ready.
                deployments = await self.hold.until_ready(route.deployment, tenant.name)
            queue = self.queues.queue(route, deployments[route.deployment])
            await queue.acquire(tenant.name, route.tier.weight, request.n)
        except (QueueFullError, QueueTimeoutError) as exc:
            self._settle(tenant, request, 0, reservation)
            # Over its tenant's share of the queue (refused or displaced): 429, its own excess.
            refusal = (
                dropped(str(exc), "queue-fair-share")
                if isinstance(exc, FairShareError)
                else unavailable(str(exc))
            )
            raise with_headers(refusal, limits.headers()) from exc
        except BaseException as exc:
            if counted:
                self._settle(tenant, request, 0, reservation)
            elif isinstance(exc, Exception):
                refusal = await self._count_late(tenant, request, floor)
                if refusal is not None:
                    raise refusal from exc
            else:
                self.background.run(self._count_late(tenant, request, floor))
            raise
        sampling = engine_pb2.SamplingParams()
        sampling.CopyFrom(request.sampling)
        sampling.max_tokens = max_tokens
        settlement = functools.partial(
            self.limiter.settlement, tenant, request.request_id, sequences=request.n
        )
        return Ticket(
            principal,
            request,
            route,
            prompt,
            sampling,
            queue,
            limits,
            settlement=settlement,
            reservation=reservation,
        )

    async def _deployments(self) -> dict[str, router_pb2.DeploymentStats]:
        try:
            return await self.catalog.models()
        except grpc.aio.AioRpcError as exc:
            raise unavailable(f"the model catalog is unreachable: {exc.code().name}") from exc

    def _route(self, request: ParsedRequest, tenant: Tenant, running: set[str]) -> Route:
        if not tenant.may_use(request.model):
            raise model_not_found(request.model)
        try:
            route = self.routes.table.resolve(
                request.model, tenant.tier, request.session_id, running
            )
        except NoDeploymentUpError as exc:
            raise unavailable(f"no deployment of model '{request.model}' is running") from exc
        if route is None:
            raise model_not_found(request.model)
        return route

    async def _stream(self, ticket: Ticket) -> AsyncIterator[Delta]:
        deltas = self.engine.generate(ticket)
        screen = self.output_filter.stream() if self.output_filter.enabled else None
        stopped: set[int] = set()
        # Once a delta came, the engine client bills the stream, and its bill
        # settles the tenant's tokens (ticket.settlement).
        started = False
        try:
            async for delta in deltas:
                started = True
                if screen is not None:
                    if delta.index in stopped:
                        continue
                    passed = screen.push(
                        delta.index, delta.text, bool(delta.finish_reason), delta.logprobs
                    )
                    delta.text, delta.logprobs = passed.text, passed.logprobs
                    if passed.stopped:
                        delta.finish_reason = "content_filter"
                        stopped.add(delta.index)
                yield delta
                if len(stopped) == ticket.request.n:
                    return
        finally:
            await deltas.aclose()
            ticket.queue.release(ticket.request.n)
            if not started and ticket.abandoned is not None:
                self.background.run(self._settle_abandoned(ticket, ticket.abandoned))
            elif not started:
                settle = self.limiter.settle(
                    ticket.principal.tenant, ticket.request.request_id, 0, ticket.request.n
                )
                self.background.after(ticket.delivered, settle)
                if ticket.reservation is not None and ticket.reservation.held:
                    self.background.after(ticket.delivered, ticket.reservation.release())

    async def _count_late(
        self, tenant: Tenant, request: ParsedRequest, floor: int
    ) -> APIError | None:
        """Count a request that failed before it was counted (counts_first was
        false) and end its lease; its refusal is the answer it would have had."""
        try:
            await self.limiter.admit(tenant, request.request_id, floor, request.n)
        except APIError as refusal:
            return refusal
        finally:
            self._settle(tenant, request, 0)
        return None

    def _settle(
        self,
        tenant: Tenant,
        request: ParsedRequest,
        used: int,
        reservation: Reservation | None = None,
    ) -> None:
        """End a request that billed nothing: its lease, its tokens, its balance hold."""
        self.background.run(self.limiter.settle(tenant, request.request_id, used, request.n))
        if reservation is not None and reservation.held:
            self.background.run(reservation.release())

    async def _settle_abandoned(self, ticket: Ticket, abandoned: asyncio.Task) -> None:
        """Settle to what the abandoned request was billed, once that is known."""
        (event,) = await asyncio.gather(abandoned, return_exceptions=True)
        used = event.prompt_tokens + event.completion_tokens if isinstance(event, UsageEvent) else 0
        await self.limiter.settle(
            ticket.principal.tenant, ticket.request.request_id, used, ticket.request.n
        )


def check_caps(request: ParsedRequest, tenant: Tenant) -> None:
    """The key's own caps on a request, before it is counted."""
    if tenant.max_tokens and request.max_tokens and request.max_tokens > tenant.max_tokens:
        raise bad_request(
            f"max_tokens is {request.max_tokens}, above this key's limit of {tenant.max_tokens}.",
            param="max_tokens",
        )
    # Each sequence holds a concurrency slot: more than the limit could never run.
    if tenant.max_concurrency and request.n > tenant.max_concurrency:
        raise bad_request(
            f"n is {request.n}, above this key's limit of {tenant.max_concurrency} "
            "concurrent sequences.",
            param="n",
        )


def with_headers(error: APIError, headers: dict[str, str]) -> APIError:
    """The error with the request's rate-limit headers added."""
    error.headers = {**headers, **(error.headers or {})}
    return error
