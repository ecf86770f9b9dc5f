from pydantic import Field

from services.common.settings import ServiceSettings


class OperatorSettings(ServiceSettings):
    port: int = Field(8080, ge=0, le=65535, description="liveness endpoint port (/healthz)")
    metrics_port: int = Field(9090, ge=0, le=65535, description="Prometheus /metrics port")
    router_address: str = Field("127.0.0.1:50052", description="router service HOST:PORT")
    namespaces: list[str] = Field(
        default_factory=list, description="namespaces to watch; empty = every namespace"
    )
    engine_image: str = Field(
        "ghcr.io/maas-dev/maas:0.1.0", description="engine image when a spec names none"
    )
    interval_seconds: float = Field(5.0, gt=0, description="autoscaler tick per ModelDeployment")
