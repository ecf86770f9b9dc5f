"""`maas serve operator`: the ModelDeployment operator process."""

import asyncio

import kopf

from maas_operator.modeldeployment.admission import AdmissionPolicy
from maas_operator.modeldeployment.autoscale import Dependencies
from maas_operator.modeldeployment.grpc_clients import RouterClient, drain_engine
from maas_operator.modeldeployment.handlers import OperatorContext, build_registry
from maas_operator.modeldeployment.kube import Credentials, KubeApi
from maas_operator.modeldeployment.routes import RoutesConfigMap
from maas_operator.modeldeployment.settings import OperatorSettings
from maas_services.common.kube_client import own_namespace
from maas_services.common.metrics import start_metrics_server


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
