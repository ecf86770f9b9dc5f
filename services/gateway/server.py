"""`maas serve gateway`: the HTTP API (uvicorn) and the tenant gRPC API in one loop.

Prometheus /metrics is served on `metrics_port` (by start_server), never on
the public HTTP port.
"""

import asyncio
import contextlib
from functools import partial
from pathlib import Path

import uvicorn

from maas.v1 import billing_pb2_grpc
from maas_services.common import event_loop
from maas_services.common.grpc_client import open_channel
from maas_services.common.grpc_server import arm_shutdown_watchdog, install_stop_signals
from maas_services.common.logging import get_logger
from maas_services.common.openai_api.output_filter import OutputFilter
from maas_services.common.redis_client import open_redis
from maas_services.common.tenant_labels import TenantLabels
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.body_budget import BodyBudget, BudgetLimits
from maas_services.gateway.admission.cold_start_hold import ColdStartHold, HoldLimits
from maas_services.gateway.admission.deployment_queues import DeploymentQueues
from maas_services.gateway.admission.quota_gate import QuotaGate
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.background import Background
from maas_services.gateway.batches.service import BatchService
from maas_services.gateway.batches.worker import BatchWorker, WorkerSettings
from maas_services.gateway.grpc_api.grpc_front import start_grpc_front
from maas_services.gateway.http_api.http_app import create_app
from maas_services.gateway.http_api.http_protocol import ConnectionLimits, GuardedHttpProtocol
from maas_services.gateway.http_api.malloc_tuning import return_large_frees
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.pipeline import Pipeline
from maas_services.gateway.responses.store import ResponseStore, StoreLimits
from maas_services.gateway.routing.model_catalog import ModelCatalog
from maas_services.gateway.routing.routes_configmap import RoutesConfigMapWatch
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_services.gateway.settings import GatewaySettings
from maas_services.gateway.upstream.adapter_loads import AdapterLoads
from maas_services.gateway.upstream.circuit_breaker import Breakers
from maas_services.gateway.upstream.engine_client import EngineClient, Timeouts
from maas_services.gateway.upstream.migration import MigrationPolicy
from maas_services.gateway.upstream.prompt_encoder import PromptEncoder
from maas_services.gateway.upstream.upstreams import Upstreams
from maas_services.gateway.usage.usage_emitter import UsageEmitter
from maas_services.gateway.usage.usage_spool import UsageSpool

log = get_logger(__name__)


def build_pipeline(settings: GatewaySettings, upstreams: Upstreams, redis, routes) -> Pipeline:
    breakers = Breakers(settings.breaker_failures, settings.breaker_cooldown_seconds)
    tenant_labels = (
        TenantLabels(settings.metrics_tenant_labels) if settings.metrics_tenant_labels else None
    )
    background = Background()
    engine = EngineClient(
        upstreams,
        Timeouts(
            connect=settings.connect_timeout_seconds,
            first_token=settings.first_token_timeout_seconds,
            total=settings.request_timeout_seconds,
        ),
        breakers,
        settings.max_attempts,
        background,
        MigrationPolicy(settings.max_migrations, settings.hold_timeout_seconds),
        AdapterLoads(
            upstreams,
            # The loads' own limiter (adapter_loads.py), its lease outliving a load.
            RateLimiter(
                redis,
                settings.adapter_load_timeout_seconds + 60,
                settings.rate_limit_on_redis_error,
            ),
            settings.adapter_loads_per_minute,
            settings.adapter_load_timeout_seconds,
        ),
    )
    # A concurrency lease outlives any request: hold, queue wait plus the whole request.
    lease = (
        settings.hold_timeout_seconds
        + settings.queue_timeout_seconds
        + settings.request_timeout_seconds
        + 60
    )
    # A replica the router no longer lists takes its breaker (and metric) with it.
    catalog = ModelCatalog(upstreams.router, settings.models_cache_seconds, breakers.retain)
    return Pipeline(
        encoder=PromptEncoder(upstreams.tokenizer),
        engine=engine,
        catalog=catalog,
        limiter=RateLimiter(redis, lease, settings.rate_limit_on_redis_error),
        routes=routes,
        queues=DeploymentQueues(settings.queue_size, settings.queue_timeout_seconds),
        output_filter=OutputFilter(settings.blocked_terms, settings.blocked_terms_action),
        quotas=QuotaGate(redis, settings.rate_limit_on_redis_error),
        background=background,
        usage=UsageEmitter(
            redis,
            UsageSpool.open(Path(settings.usage_spool_dir)),
            tenant_labels=tenant_labels,
            claim_root=Path(settings.usage_spool_claim_dir)
            if settings.usage_spool_claim_dir
            else None,
        ),
        hold=ColdStartHold(
            catalog.models,
            upstreams.router.ReportHeld,
            HoldLimits(
                max_held=settings.hold_max_requests,
                max_held_per_tenant=settings.hold_max_requests_per_tenant,
                timeout_seconds=settings.hold_timeout_seconds,
            ),
        ),
    )


def http_server(settings: GatewaySettings, gateway: Gateway) -> uvicorn.Server:
    """The HTTP front: the app on uvicorn, over our protocol (http_protocol.py)."""
    limits = ConnectionLimits(
        settings.max_connections, settings.max_header_bytes, settings.header_timeout_seconds
    )
    config = uvicorn.Config(
        create_app(gateway),
        host=settings.host,
        port=settings.port,
        log_config=None,
        http=partial(GuardedHttpProtocol, limits=limits),
        # No route speaks WebSocket: an Upgrade header must not switch protocols.
        ws="none",
        # One log line per request would cost more than shedding a 429;
        # maas_gateway_http_responses_total counts them instead.
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
    )
    http = uvicorn.Server(config)
    # Signals are ours, not uvicorn's: one SIGTERM stops both fronts in order
    # (run_gateway). uvicorn takes SIGTERM/SIGINT for the whole of serve() in
    # capture_signals (0.54 has no install_signal_handlers to turn off), and would
    # close the HTTP front first, before health says NOT_SERVING.
    http.capture_signals = contextlib.nullcontext
    return http


async def run_gateway(settings: GatewaySettings) -> None:
    """The gateway process: both fronts until SIGTERM, then a drain in order."""
    return_large_frees()
    redis = open_redis(settings.redis_url)
    upstreams = Upstreams(settings.tokenizer_address, settings.router_address)
    routes = RoutesWatcher(
        settings.routes_file,
        settings.routes_poll_seconds,
        RoutesConfigMapWatch.from_settings(settings),
    )
    routes.start()
    pipeline = build_pipeline(settings, upstreams, redis, routes)
    pipeline.usage.start()
    billing = (
        billing_pb2_grpc.BillingStub(open_channel(settings.billing_address, "gateway"))
        if settings.billing_address
        else None
    )
    auth = Authenticator(
        TenantStore(redis),
        settings.auth_cache_seconds,
        settings.auth_on_redis_error,
        max_stale=settings.auth_max_stale_seconds,
    )
    # One byte budget for both fronts: a tenant's bodies and messages count together.
    budget = BodyBudget(BudgetLimits.from_settings(settings))
    handle = await start_grpc_front(settings, pipeline, auth, budget)
    responses = await ResponseStore.open(
        settings.responses_database_url, StoreLimits.from_settings(settings)
    )
    batch_service = await BatchService.from_settings(settings)
    gateway = Gateway(
        pipeline,
        auth,
        redis,
        settings.max_body_bytes,
        billing,
        settings.body_timeout_seconds,
        budget,
        responses,
        batch_service,
    )
    # Batch lines run in this process, in capacity its interactive requests leave idle.
    worker = BatchWorker(
        batch_service.batches,
        batch_service.files,
        pipeline,
        TenantStore(redis),
        WorkerSettings.from_settings(settings),
    )
    if settings.batch_concurrency:
        worker.start()
    http = http_server(settings, gateway)
    http_task = asyncio.create_task(http.serve())
    stop = asyncio.Event()
    install_stop_signals(stop)
    await stop.wait()
    log.info("shutdown_started")
    arm_shutdown_watchdog(settings.shutdown_grace_seconds)
    await handle.set_serving(False)
    http.should_exit = True
    await asyncio.gather(http_task, handle.server.stop(settings.shutdown_grace_seconds))
    await worker.stop()
    await routes.stop()
    await pipeline.hold.close()
    await pipeline.background.wait()
    await pipeline.usage.stop()
    await responses.close()
    await batch_service.close()
    await upstreams.close()
    await redis.aclose()
    log.info("shutdown_complete")


def main(settings: GatewaySettings) -> None:
    event_loop.run(run_gateway(settings))
