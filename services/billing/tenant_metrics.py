"""Per-tenant request and token counters, exported by billing.

Billing counts each request exactly once (duplicates are dropped before this),
so these are the per-tenant numbers to put on a dashboard. Tenant labels are
bounded as services/common/tenant_labels.py describes.
"""

from prometheus_client import Counter

from maas_services.common.tenant_labels import OTHER, TenantLabels
from maas_services.common.usage_event import UsageEvent

__all__ = ["OTHER", "TenantMetrics"]

REQUESTS = Counter("maas_billing_tenant_requests", "Requests billed, by tenant", ["tenant"])
TOKENS = Counter(
    "maas_billing_tenant_tokens", "Tokens billed, by tenant and kind", ["tenant", "kind"]
)


class TenantMetrics(TenantLabels):
    def record(self, event: UsageEvent) -> None:
        tenant = self.label(event.tenant)
        REQUESTS.labels(tenant).inc()
        TOKENS.labels(tenant, "prompt").inc(event.prompt_tokens)
        TOKENS.labels(tenant, "cached_prompt").inc(event.cached_prompt_tokens)
        TOKENS.labels(tenant, "completion").inc(event.completion_tokens)
