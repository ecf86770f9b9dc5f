"""Compiled grammars kept per tenant: (tenant, kind, text) -> grammar, bounded in bytes.

xgrammar's own cache is keyed by the grammar alone and shared by everyone
who compiles against the vocabulary. Shared, it is a timing oracle (a fast
answer tells one tenant that another sent that schema) and one tenant's
stream of new grammars evicts every other tenant's. Keyed by tenant, a hit
only ever comes from the tenant's own earlier request, and eviction starts
with the tenant holding the most bytes: a tenant over its own cap evicts
only itself, and when the total is full, the largest tenant pays first.
xgrammar's cache is disabled (worker.py).
"""

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

Value = TypeVar("Value")


class TenantCache(Generic[Value]):
    def __init__(self, total_bytes: int, tenant_bytes: int):
        self.total_bytes = total_bytes
        self.tenant_bytes = tenant_bytes
        self._lock = threading.Lock()  # the engine's compile thread and its core both look up
        self._tenants: dict[str, OrderedDict[tuple[str, str], tuple[Value, int]]] = {}
        self._held: dict[str, int] = {}

    def get(self, tenant: str, kind: str, text: str) -> Value | None:
        with self._lock:
            entries = self._tenants.get(tenant)
            if entries is None or (kind, text) not in entries:
                return None
            entries.move_to_end((kind, text))
            return entries[(kind, text)][0]

    def put(self, tenant: str, kind: str, text: str, value: Value, size: int) -> None:
        """Keep value, charged size bytes plus its key's; too big for a tenant: not kept."""
        size += len(kind) + len(text)
        if size > min(self.tenant_bytes, self.total_bytes):
            return
        with self._lock:
            entries = self._tenants.setdefault(tenant, OrderedDict())
            old = entries.pop((kind, text), None)
            self._held[tenant] = self._held.get(tenant, 0) - (old[1] if old else 0) + size
            entries[(kind, text)] = (value, size)
            while self._held[tenant] > self.tenant_bytes:
                self._evict(tenant)
            while sum(self._held.values()) > self.total_bytes:
                self._evict(max(self._held, key=self._held.__getitem__))

    def bytes_held(self, tenant: str) -> int:
        with self._lock:
            return self._held.get(tenant, 0)

    def _evict(self, tenant: str) -> None:
        entries = self._tenants[tenant]
        _, (_, size) = entries.popitem(last=False)
        self._held[tenant] -= size
        if not entries:
            del self._tenants[tenant], self._held[tenant]
