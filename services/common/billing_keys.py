"""Where billing keeps a tenant's money and tokens in Redis.

Billing's ledger writes these keys; the gateway reads the quota state from
them before admitting a request (services/common/quota.py). Shared here so
neither service imports the other.
"""

import time

PREFIX = "maas:billing:"


def tenant_key(tenant: str, suffix: str = "") -> str:
    return f"{PREFIX}tenant:{tenant}{suffix}"


def month_key(tenant: str, when: float) -> str:
    return tenant_key(tenant, f":month:{time.strftime('%Y%m', time.gmtime(when))}")


def balance_key(tenant: str) -> str:
    return f"{PREFIX}balance:{tenant}"
