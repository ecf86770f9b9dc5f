"""From an authenticated request to engine deltas, the same for both fronts.

admit: route the model name -> refuse an exhausted quota -> count the request
against the tenant's RPM and concurrency (before any work is done for it) ->
tokenize -> reserve prompt + max_tokens against its TPM -> wait for a fair
share of the deployment's slots.
generate: stream from the engine at the tier's priority, through the output
filter; at the end free the slots and settle the tenant's tokens to what was
really used (for a client that left before the first token: the prompt
tokens the engine computed and billed, see completions.py).

A request that passed the limiter counts toward the tenant's RPM even if it
then fails (a prompt too long for the context, queue full, engine error); its
concurrency lease ends and its tokens are settled to what it used. A request
with n sequences costs n: of the tenant's concurrency, and of the
deployment's slots in the fair queue.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from maas.v1 import engine_pb2
from services.common.usage_event import UsageEvent
from services.gateway.admission import Admission
from services.gateway.completions import CompletionService, Delta, Job, Prompt
from services.gateway.errors import APIError, bad_request, model_not_found, unavailable
from services.gateway.fair_queue import FairQueue, QueueFullError, QueueTimeoutError
from services.gateway.output_filter import OutputFilter
from services.gateway.quota_gate import QuotaGate
from services.gateway.rate_limiter import LimitDecision, RateLimiter
from services.gateway.routes_watcher import RoutesWatcher
from services.gateway.routing_table import NoDeploymentUpError, Route
from services.gateway.tenants import Principal, Tenant


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    model: str
    max_tokens: int | None
    n: int = 1
    session_id: str = ""


# Tokenizes for a route: (route, the client's max_tokens) -> prompt.
Encoder = Callable[[Route, int | None], Awaitable[Prompt]]


@dataclass
class Ticket:
    """An admitted request: holds a queue slot and a token reservation."""

    principal: Principal
    spec: RequestSpec
    route: Route
    prompt: Prompt
    max_tokens: int
    queue: FairQueue
    limits: LimitDecision

    @property
    def headers(self) -> dict[str, str]:
        return self.limits.headers()


class Pipeline:
    def __init__(
        self,
        service: CompletionService,
        limiter: RateLimiter,
        routes: RoutesWatcher,
        admission: Admission,
        output_filter: OutputFilter,
        quotas: QuotaGate,
    ):
        self.service = service
        self._quotas = quotas
        self._limiter = limiter
        self._routes = routes
        self._admission = admission
        self._filter = output_filter

    async def models(self, tenant: Tenant | None = None) -> list[str]:
        """Names a tenant may send now (every name when tenant is None)."""
        tier = tenant.tier if tenant else None
        names = self._routes.table.names(set(await self.service.deployments()), tier)
        return [n for n in names if tenant is None or tenant.may_use(n)]

    async def admit(self, principal: Principal, spec: RequestSpec, encode: Encoder) -> Ticket:
        tenant = principal.tenant
        deployments = await self.service.deployments()
        route = self._route(spec, tenant, set(deployments))
        self._check_cap(spec, tenant)
        await self._quotas.check(tenant.name)
        floor = spec.n * (spec.max_tokens or 1)
        limits = await self._limiter.admit(tenant, spec.request_id, floor, spec.n)
        try:
            prompt = await encode(route, spec.max_tokens)
            room = max(prompt.max_model_len - len(prompt.token_ids), 1)
            max_tokens = spec.max_tokens or min(tenant.max_tokens or room, room)
            need = len(prompt.token_ids) + spec.n * max_tokens
            limits = await self._limiter.reserve(limits, spec.request_id, need)
            queue = self._admission.queue(route, deployments[route.deployment])
            await queue.acquire(tenant.name, route.tier.weight, spec.n)
        except (QueueFullError, QueueTimeoutError) as exc:
            self._settle(tenant, spec, 0)
            raise with_headers(unavailable(str(exc)), limits.headers()) from exc
        except BaseException:
            self._settle(tenant, spec, 0)
            raise
        return Ticket(principal, spec, route, prompt, max_tokens, queue, limits)

    def _route(self, spec: RequestSpec, tenant: Tenant, running: set[str]) -> Route:
        if not tenant.may_use(spec.model):
            raise model_not_found(spec.model)
        try:
            route = self._routes.table.resolve(spec.model, tenant.tier, spec.session_id, running)
        except NoDeploymentUpError as exc:
            raise unavailable(f"no deployment of model '{spec.model}' is running") from exc
        if route is None:
            raise model_not_found(spec.model)
        return route

    @staticmethod
    def _check_cap(spec: RequestSpec, tenant: Tenant) -> None:
        if tenant.max_tokens and spec.max_tokens and spec.max_tokens > tenant.max_tokens:
            raise bad_request(
                f"max_tokens is {spec.max_tokens}, above this key's limit of {tenant.max_tokens}.",
                param="max_tokens",
            )
        # Each sequence holds a concurrency slot: more than the limit could never run.
        if tenant.max_concurrency and spec.n > tenant.max_concurrency:
            raise bad_request(
                f"n is {spec.n}, above this key's limit of {tenant.max_concurrency} "
                "concurrent sequences.",
                param="n",
            )

    async def generate(
        self, ticket: Ticket, sampling: engine_pb2.SamplingParams
    ) -> AsyncIterator[Delta]:
        """Deltas for an admitted request; errors before the first raise APIError."""
        sampling.max_tokens = ticket.max_tokens
        job = Job(
            principal=ticket.principal,
            request_id=ticket.spec.request_id,
            model=ticket.spec.model,
            deployment=ticket.route.deployment,
            prompt_ids=ticket.prompt.token_ids,
            sampling=sampling,
            priority=ticket.route.tier.priority,
            session_id=ticket.spec.session_id,
            share_prefix_cache=ticket.route.share_prefix_cache,
        )
        deltas = self.service.generate(job)
        screen = self._filter.stream() if self._filter.enabled else None
        stopped: set[int] = set()
        last: Delta | None = None
        try:
            async for delta in deltas:
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
                last = delta
                yield delta
                if len(stopped) == ticket.spec.n:
                    return
        finally:
            await deltas.aclose()
            ticket.queue.release(ticket.spec.n)
            if last is None and job.abandoned is not None:
                self.service.in_background(self._settle_abandoned(ticket, job.abandoned))
            else:
                used = last.prompt_tokens + last.completion_tokens if last else 0
                self._settle(ticket.principal.tenant, ticket.spec, used)

    def _settle(self, tenant: Tenant, spec: RequestSpec, used: int) -> None:
        self.service.in_background(self._limiter.settle(tenant, spec.request_id, used, spec.n))

    async def _settle_abandoned(self, ticket: Ticket, abandoned: asyncio.Task) -> None:
        """Settle to what the abandoned request was billed, once that is known."""
        (event,) = await asyncio.gather(abandoned, return_exceptions=True)
        used = event.prompt_tokens + event.completion_tokens if isinstance(event, UsageEvent) else 0
        await self._limiter.settle(
            ticket.principal.tenant, ticket.spec.request_id, used, ticket.spec.n
        )


def with_headers(error: APIError, headers: dict[str, str]) -> APIError:
    """The error with the request's rate-limit headers added."""
    error.headers = {**headers, **(error.headers or {})}
    return error
