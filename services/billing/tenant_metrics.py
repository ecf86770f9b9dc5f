"""Per-tenant request and token counters, exported by billing.

Billing counts each request exactly once (duplicates are dropped before this),
so these are the per-tenant numbers to put on a dashboard. A tenant label can
only hold a configured tenant's name (events come from authenticated keys),
and at most `limit` of them per process: past that, tenants share the label
"_other" (no tenant name starts with "_"), so a platform with thousands of
tenants cannot flood Prometheus.
"""

from prometheus_client import Counter

from services.common.usage_event import UsageEvent

OTHER = "_other"

REQUESTS = Counter("maas_billing_tenant_requests", "Requests billed, by tenant", ["tenant"])
TOKENS = Counter(
    "maas_billing_tenant_tokens", "Tokens billed, by tenant and kind", ["tenant", "kind"]
)


class TenantMetrics:
    def __init__(self, limit: int):
        self._limit = limit
        self._named: set[str] = set()

    def label(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        if len(self._named) < self._limit:
            self._named.add(tenant)
            return tenant
        return OTHER

    def record(self, event: UsageEvent) -> None:
        tenant = self.label(event.tenant)
        REQUESTS.labels(tenant).inc()
        TOKENS.labels(tenant, "prompt").inc(event.prompt_tokens)
        TOKENS.labels(tenant, "cached_prompt").inc(event.cached_prompt_tokens)
        TOKENS.labels(tenant, "completion").inc(event.completion_tokens)
