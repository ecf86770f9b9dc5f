"""From an authenticated principal and a parsed request to an admitted Run, for both fronts.

Pipeline.admit runs the steps before the engine, in order:
1. limits pre-check: key caps (400), quota, RPM and concurrency, counted
   before any work is done for the request (for a tenant the limiter last
   admitted, in step 4 instead, with its tokens, or, with no TPM, beside
   step 3: rate_limiter.py);
2. resolve route: the model name (alias, canary, tier) -> a running deployment,
   or one scaled to zero;
3. tokenize (prompt_encoder.py);
4. admit: reserve prompt + max_tokens against the tenant's TPM and, for a
   prepaid tenant, their most cost against its balance (quota_gate.py), the two
   in one Redis round trip (store_trip.py), hold while a
   deployment scaled to zero starts a replica (cold_start_hold.py), then wait
   for a fair share of the deployment's slots (deployment_queues.py);
and returns the request's Run (run.py), whose deltas, as they are read, run
5. pick (sent beside step 4's reserve trip and queue where the request would
take a slot at once: engine_client.EarlyPick), 6. generate (engine_client.py,
retries included) and 7. the output filter, and which alone owns 8. the end:
the slot freed, the usage event with the TPM and balance settlements in its
round trip.

A request that passed the limiter counts toward the tenant's RPM even if it
then fails (an unknown model, a prompt too long for the context, queue full,
engine error); its concurrency lease ends and its tokens are settled to what
it used. A request that fails here, before it has a Run, is settled to 0
here (_settle). A request with n sequences costs n: of the tenant's
concurrency, and of the deployment's slots in the fair queue.
"""

import asyncio
from dataclasses import dataclass

import grpc
from opentelemetry import trace

from maas.v1 import engine_pb2, router_pb2
from maas_services.common.defaults import default_max_tokens
from maas_services.common.openai_api.errors import (
    APIError,
    bad_request,
    dropped,
    model_not_found,
    unavailable,
)
from maas_services.common.openai_api.output_filter import OutputFilter
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.gateway.admission.cold_start_hold import ColdStartHold, ready
from maas_services.gateway.admission.deployment_queues import DeploymentQueues
from maas_services.gateway.admission.fair_queue import (
    FairShareError,
    QueueFullError,
    QueueTimeoutError,
)
from maas_services.gateway.admission.quota_gate import QuotaGate, Reservation
from maas_services.gateway.admission.rate_limiter import LimitDecision, RateLimiter
from maas_services.gateway.admission.store_trip import replies
from maas_services.gateway.admission.tenants import Principal, Tenant
from maas_services.gateway.background import Background
from maas_services.gateway.routing.deployment_serves import check_serves
from maas_services.gateway.routing.model_catalog import ModelCatalog
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_services.gateway.routing.routing_table import NoDeploymentUpError, Route
from maas_services.gateway.run import Run
from maas_services.gateway.ticket import Ticket
from maas_services.gateway.upstream.engine_client import EarlyPick, EngineClient
from maas_services.gateway.upstream.prompt_encoder import Prompt, PromptEncoder
from maas_services.gateway.usage.usage_emitter import UsageEmitter

# One span per admission step, children of the request's HTTP or gRPC span
# (the tokenizer's and router's calls have their own CLIENT spans): where a
# request's time before its engine goes, in a trace (benchmarks/gateway_latency.py).
tracer = trace.get_tracer("maas.gateway")


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
    usage: UsageEmitter

    async def models(self, tenant: Tenant | None = None) -> dict[str, str]:
        """Names a tenant may send now (every model's when tenant is None), each
        with its parent: an adapter's base deployment, "" for a model."""
        deployments = await self._deployments()
        table = self.routes.table
        names = dict.fromkeys(table.names(set(deployments), tenant.tier if tenant else None), "")
        if tenant is not None:
            adapters = table.adapter_names(
                set(deployments), tenant.tier, tenant.name, shared_adapters(deployments)
            )
            names.update(sorted(adapters.items()))
        return {n: parent for n, parent in names.items() if tenant is None or tenant.may_use(n)}

    def resolve(
        self,
        model: str,
        tenant: Tenant,
        session: str,
        deployments: dict[str, router_pb2.DeploymentStats],
    ) -> Route | None:
        """The route of `model` for this tenant; None where it may not use it
        (routing_table.py: aliases, tiers, adapters and their visibility)."""
        if not tenant.may_use(model):
            return None
        table = self.routes.table
        # Only a name the table does not route can be a shared adapter: a request for a
        # model (nearly all) does not collect every deployment's adapters.
        shared = None if model in table.models else shared_adapters(deployments)
        return table.resolve(model, tenant.tier, session, set(deployments), tenant.name, shared)

    async def admit(self, principal: Principal, request: ParsedRequest) -> Run:
        """Steps 1-4; the Run streams the rest and owns the request's end."""
        ticket = await self._admit(principal, request)
        return Run(
            ticket, self.engine, self.output_filter, self.limiter, self.usage, self.background
        )

    async def _admit(self, principal: Principal, request: ParsedRequest) -> Ticket:
        tenant = principal.tenant
        check_caps(request, tenant)
        floor = request.n * (request.max_tokens or 1)
        with tracer.start_as_current_span("gateway.limits"):
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
        early: EarlyPick | None = None
        try:
            with tracer.start_as_current_span("gateway.route"):
                deployments = await self._deployments()
                route = self._route(request, tenant, deployments)
            if counted or tenant.tpm:
                prompt = await self.encoder.encode(
                    route.tokenizer, request.prompt, request.max_tokens
                )
            else:
                counted = True
                prompt, limits = await self._encode_counted(tenant, request, route, floor)
            if request.sampling.HasField("grammar"):
                await self.encoder.check_grammar(
                    route.tokenizer, request.sampling.grammar, request.grammar_param, tenant.name
                )
            check_serves(request, deployments.get(route.deployment))
            room = default_max_tokens(prompt.max_model_len, len(prompt.token_ids))
            # An embedding is a prefill only: nothing to generate, its reservation the prompt.
            embeds = request.sampling.HasField("embedding")
            max_tokens = 0 if embeds else request.max_tokens or min(tenant.max_tokens or room, room)
            need = len(prompt.token_ids) + request.n * max_tokens
            stats = deployments.get(route.deployment)
            # The router's pick runs beside the reserve trip and the queue, for a
            # request that would take a slot at once: one that waits picks when
            # admitted anyway (EARLY_PICK_SECONDS), and a full queue's refusals
            # then leave no pick counted at a replica (engine_client.EarlyPick).
            if ready(stats) and not self.queues.queue(route, stats).waiting:
                early = self.engine.pick_early(request, route, prompt, tenant.name)
            with tracer.start_as_current_span("gateway.reserve"):
                # The TPM charge and the balance's hold in one round trip (store_trip.py).
                if counted:
                    charge = self.limiter.reserve_call(limits, request.request_id, need)
                else:
                    # Whatever it answers, the request has been counted or refused.
                    counted = True
                    charge = self.limiter.admit_call(
                        tenant, request.request_id, floor, request.n, need
                    )
                hold = await self.quotas.hold_call(
                    reservation,
                    route.deployment,
                    len(prompt.token_ids),
                    request.n * max_tokens,
                    route.adapter,
                )
                answers = iter(await replies(*(c for c in (charge, hold) if c is not None)))
                # The limiter's first: a request it refuses releases its hold as it ends.
                if charge is not None:
                    limits = self.limiter.decided(charge, next(answers))
                if hold is not None:
                    self.quotas.hold_answered(hold, next(answers))
            with tracer.start_as_current_span("gateway.queue"):
                if route.scales_to_zero and not ready(deployments.get(route.deployment)):
                    # Before the queue, which is sized from the replicas that are ready.
                    deployments = await self.hold.until_ready(route.deployment, tenant.name)
                queue = self.queues.queue(route, deployments[route.deployment])
                await queue.acquire(tenant.name, route.tier.weight, request.n)
        except (QueueFullError, QueueTimeoutError) as exc:
            if early is not None:
                early.cancel()
            self._settle(tenant, request, 0, reservation)
            # Over its tenant's share of the queue (refused or displaced): 429, its own excess.
            refusal = (
                dropped(str(exc), "queue-fair-share")
                if isinstance(exc, FairShareError)
                else unavailable(str(exc))
            )
            raise with_headers(refusal, limits.headers()) from exc
        except BaseException as exc:
            if early is not None:
                early.cancel()
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
        return Ticket(
            principal, request, route, prompt, sampling, queue, limits, reservation, early
        )

    async def _encode_counted(
        self, tenant: Tenant, request: ParsedRequest, route: Route, floor: int
    ) -> tuple[Prompt, LimitDecision]:
        """Tokenize while the limiter counts the request (a tenant with no TPM,
        which it last admitted: nothing to charge once tokenized), its round trip
        in the tokenizer's time. The count is waited for whatever the tokenizer
        answers, so the request is counted or refused, and a refusal is the
        answer, as if it had been counted first."""
        counting = asyncio.ensure_future(
            self.limiter.admit(tenant, request.request_id, floor, request.n)
        )
        try:
            prompt = await self.encoder.encode(route.tokenizer, request.prompt, request.max_tokens)
        except asyncio.CancelledError:
            # The caller is gone: the count only has to end before the request's settle.
            await asyncio.wait([counting])
            raise
        except Exception:
            await counting
            raise
        return prompt, await counting

    async def _deployments(self) -> dict[str, router_pb2.DeploymentStats]:
        try:
            return await self.catalog.models()
        except grpc.aio.AioRpcError as exc:
            raise unavailable(f"the model catalog is unreachable: {exc.code().name}") from exc

    def _route(
        self,
        request: ParsedRequest,
        tenant: Tenant,
        deployments: dict[str, router_pb2.DeploymentStats],
    ) -> Route:
        try:
            route = self.resolve(request.model, tenant, request.session_id, deployments)
        except NoDeploymentUpError as exc:
            raise unavailable(f"no deployment of model '{request.model}' is running") from exc
        if route is None:
            raise model_not_found(request.model)
        return route

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


def shared_adapters(deployments: dict[str, router_pb2.DeploymentStats]) -> dict[str, str]:
    """adapter -> deployment of the adapters the router reports loaded, the
    first deployment by name where two report one; the routing table keeps
    those it lists to itself (routing_table.py)."""
    shared: dict[str, str] = {}
    for name in sorted(deployments):
        for adapter in deployments[name].adapters:
            shared.setdefault(adapter, name)
    return shared


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
