from pydantic import Field

from services.common.redis_client import DEFAULT_REDIS_URL
from services.common.settings import ServiceSettings


class BillingSettings(ServiceSettings):
    redis_url: str = Field(DEFAULT_REDIS_URL, description="Redis holding the usage stream")
    consumer_group: str = "billing"
    consumer_name: str = Field("", description="unique per replica; empty = hostname-pid")
    batch_size: int = Field(100, gt=0, description="entries read per XREADGROUP")
    block_ms: int = Field(1000, gt=0, description="how long one read waits for new entries")
    prices_file: str = Field("", description="YAML price table; empty = everything free")
    claim_idle_ms: int = Field(
        30_000, gt=0, description="claim entries another consumer left pending this long"
    )
    metrics_tenants: int = Field(
        100, ge=0, description="tenants with a label of their own on per-tenant metrics"
    )
