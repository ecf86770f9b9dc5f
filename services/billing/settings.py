from pydantic import Field

from maas_services.billing.ledger import DAY, Retention
from maas_services.billing.store.line_items import DEFAULT_DATABASE_URL
from maas_services.common.redis_client import DEFAULT_REDIS_URL
from maas_services.common.settings import ServiceSettings


class BillingSettings(ServiceSettings):
    redis_url: str = Field(DEFAULT_REDIS_URL, description="Redis holding the usage stream")
    # The flag --billing-database-url, the environment MAAS_BILLING_DATABASE_URL (the chart).
    billing_database_url: str = Field(
        DEFAULT_DATABASE_URL,
        description="where line items are kept: postgresql://user:password@host/db, or "
        "sqlite:///path (the default, embedded, for one replica)",
    )
    consumer_group: str = "billing"
    consumer_name: str = Field("", description="unique per replica; empty = hostname-pid")
    batch_size: int = Field(
        500, gt=0, le=2000, description="entries read per XREADGROUP: one database transaction"
    )
    block_ms: int = Field(1000, gt=0, description="how long one read waits for new entries")
    prices_file: str = Field("", description="YAML price table; empty = everything free")
    claim_idle_ms: int = Field(
        30_000, gt=0, description="claim entries another consumer left pending this long"
    )
    unready_after_seconds: float = Field(
        30.0, gt=0, description="not ready when no consumer pass has succeeded for this long"
    )
    max_lag_seconds: float = Field(
        300.0, gt=0, description="not ready while the last committed event is older than this"
    )
    stuck_after_seconds: float = Field(
        60.0,
        gt=5,
        description="not live when the consumer loop has not turned for this long "
        "(above the 5 s longest retry backoff plus a Redis timeout)",
    )
    metrics_tenants: int = Field(
        100, ge=0, description="tenants with a label of their own on per-tenant metrics"
    )
    trim_interval_seconds: float = Field(
        5.0,
        gt=0,
        le=10,
        description="how often acknowledged usage entries are trimmed from the stream",
    )
    line_item_retention_days: int = Field(90, gt=0, description="line items kept this long")
    hourly_retention_days: int = Field(30, gt=0, description="hourly buckets kept this long")
    daily_retention_days: int = Field(
        400, gt=0, description="daily buckets and monthly token counters kept this long"
    )
    dedup_window_days: int = Field(
        7,
        gt=0,
        description="events that started longer ago are refused, never billed (at most the "
        "line items' retention: a line item is its request's dedup key)",
    )
    upkeep_interval_seconds: float = Field(
        60.0, gt=0, description="how often the outbox, partitions and retention are seen to"
    )

    def retention(self) -> Retention:
        return Retention(
            line_items=self.line_item_retention_days * DAY,
            hourly=self.hourly_retention_days * DAY,
            daily=self.daily_retention_days * DAY,
            dedup_window=self.dedup_window_days * DAY,
        )
