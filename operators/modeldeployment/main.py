"""`maas serve operator`: the ModelDeployment operator process."""

import asyncio

import kopf

from operators.modeldeployment.admission import AdmissionPolicy
from operators.modeldeployment.autoscale import Dependencies
from operators.modeldeployment.grpc_clients import RouterClient, drain_engine
from operators.modeldeployment.handlers import OperatorContext, build_registry
from operators.modeldeployment.kube import Credentials, KubeApi
from operators.modeldeployment.routes import RoutesConfigMap
from operators.modeldeployment.settings import OperatorSettings
from services.common.kubernetes_client import own_namespace
from services.common.metrics import start_metrics_server


def routes_configmap(settings: OperatorSettings) -> RoutesConfigMap | None:
    if not settings.routes_configmap:
        return None
    namespace = settings.routes_namespace or own_namespace()
    return RoutesConfigMap(namespace, settings.routes_configmap)


async def serve(settings: OperatorSettings) -> None:
    router = RouterClient(settings.router_address)
    # Real credentials arrive with kopf's login, before any handler runs.
    api = KubeApi(Credentials(server="https://kubernetes.default.svc"))
    ctx = OperatorContext(
        deps=Dependencies(api=api, pool_stats=router.pool_stats, drain_engine=drain_engine),
        engine_image=settings.engine_image,
        vllm_image=settings.vllm_image,
        interval_seconds=settings.interval_seconds,
        service_token_secret=settings.service_token_secret,
        routes=routes_configmap(settings),
        admission=AdmissionPolicy(
            # A spec may name the default images outright.
            allowed_images=(*settings.allowed_images, settings.engine_image, settings.vllm_image),
            credentials_secret_pattern=settings.credentials_secret_pattern,
        ),
    )
    start_metrics_server(settings.host, settings.metrics_port)
    try:
        await kopf.operator(
            registry=build_registry(ctx),
            # One replica (Recreate strategy in the chart): no peering objects needed.
            standalone=True,
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            liveness_endpoint=f"http://{settings.host}:{settings.port}/healthz",
        )
    finally:
        await router.close()
        await api.close()


def main(settings: OperatorSettings) -> None:
    asyncio.run(serve(settings))
