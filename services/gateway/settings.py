from typing import Literal

from pydantic import Field

from services.common.redis_client import DEFAULT_REDIS_URL
from services.common.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    port: int = Field(8080, ge=0, le=65535, description="HTTP port (OpenAI API, /metrics)")
    grpc_port: int = Field(0, ge=0, le=65535, description="tenant gRPC port (0 picks one)")
    redis_url: str = Field(DEFAULT_REDIS_URL, description="Redis with tenants, keys and usage")
    tokenizer_address: str = Field("127.0.0.1:50051", description="tokenizer service HOST:PORT")
    router_address: str = Field("127.0.0.1:50052", description="router service HOST:PORT")
    connect_timeout_seconds: float = Field(5.0, gt=0)
    request_timeout_seconds: float = Field(600.0, gt=0, description="total time for one request")
    models_cache_seconds: float = Field(2.0, ge=0, description="how long the model list is reused")
    auth_on_redis_error: Literal["fail_closed"] = Field(
        "fail_closed", description="when Redis is down, refuse (503) rather than serve unknown keys"
    )
