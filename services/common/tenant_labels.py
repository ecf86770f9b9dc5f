"""Bounded tenant label values for per-tenant Prometheus series.

A tenant label can only hold a configured tenant's name (the name comes from an
authenticated key), and at most `limit` of them per process: past that,
tenants share the label "_other" (no tenant name starts with "_"), so a
platform with thousands of tenants cannot flood Prometheus.
"""

OTHER = "_other"


class TenantLabels:
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
