import re

from pydantic import Field, field_validator

from maas_operator.modeldeployment.vllm_pod import DEFAULT_VLLM_IMAGE
from maas_services.common.defaults import METRICS_PORT, OPERATOR_HEALTH_PORT, ROUTER_PORT
from maas_services.common.settings import ServiceSettings


class OperatorSettings(ServiceSettings):
    port: int = Field(
        OPERATOR_HEALTH_PORT, ge=0, le=65535, description="liveness endpoint port (/healthz)"
    )
    metrics_port: int = Field(METRICS_PORT, ge=0, le=65535, description="Prometheus /metrics port")
    router_address: str = Field(f"127.0.0.1:{ROUTER_PORT}", description="router service HOST:PORT")
    namespaces: list[str] = Field(
        default_factory=list, description="namespaces to watch; empty = every namespace"
    )
    engine_image: str = Field(
        "ghcr.io/maas-dev/maas:0.1.0", description="engine image when a spec names none"
    )
    vllm_image: str = Field(
        DEFAULT_VLLM_IMAGE, description="vLLM image when a backend-vllm spec names none"
    )
    allowed_images: list[str] = Field(
        default_factory=list,
        description="image patterns (fnmatch) a spec may name, besides --engine-image "
        "and --vllm-image",
    )
    credentials_secret_pattern: str = Field(
        "model-credentials-[a-z0-9][a-z0-9.-]*",
        description="regular expression a spec's credentialsSecret must match in full",
    )
    interval_seconds: float = Field(5.0, gt=0, description="autoscaler tick per ModelDeployment")
    routes_configmap: str = Field(
        "maas-operator-routes",
        description="ConfigMap the operator writes the gateway's routes into (aliases, "
        "canary weights, scale to zero); empty = write none",
    )
    routes_namespace: str = Field(
        "", description="namespace of that ConfigMap; empty = the operator's own"
    )
    service_token_secret: str = Field(
        "",
        description="Secret in each engine's namespace whose service-token engines demand "
        "of callers (and whose vllm-api-key a vLLM server demands of its adapter); "
        "empty = engines accept any caller",
    )

    @field_validator("credentials_secret_pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return pattern
