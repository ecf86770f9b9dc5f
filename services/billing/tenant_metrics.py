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
    def record(self, events: list[UsageEvent]) -> None:
        """Count a batch's billed events: summed per tenant first, since a
        labelled counter's lookup costs more than the addition."""
        sums: dict[str, list[int]] = {}
        for event in events:
            s = sums.setdefault(event.tenant, [0, 0, 0, 0])
            s[0] += 1
            s[1] += event.prompt_tokens
            s[2] += event.cached_prompt_tokens
            s[3] += event.completion_tokens
        for name, (requests, prompt, cached, completion) in sums.items():
            tenant = self.label(name)
            REQUESTS.labels(tenant).inc(requests)
            TOKENS.labels(tenant, "prompt").inc(prompt)
            TOKENS.labels(tenant, "cached_prompt").inc(cached)
            TOKENS.labels(tenant, "completion").inc(completion)
