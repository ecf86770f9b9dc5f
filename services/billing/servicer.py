"""maas.v1.Billing: usage totals per tenant."""

import grpc

from maas.v1 import billing_pb2, billing_pb2_grpc
from services.billing.counters import TENANT_FIELDS, TenantCounters


class BillingServicer(billing_pb2_grpc.BillingServicer):
    def __init__(self, counters: TenantCounters):
        self._counters = counters

    async def GetUsage(self, request, context):
        if not request.tenant:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tenant is required")
        raw = await self._counters.read(request.tenant)
        totals = {name: raw.get(name, 0) for name in TENANT_FIELDS}
        models: dict[str, dict[str, int]] = {}
        for key, value in raw.items():
            if key.startswith("model:"):
                model, field = key[len("model:") :].rsplit(":", 1)
                models.setdefault(model, {})[field] = value
        return billing_pb2.GetUsageResponse(
            tenant=request.tenant,
            total_tokens=totals["prompt_tokens"] + totals["completion_tokens"],
            models=[billing_pb2.ModelUsage(model=m, **f) for m, f in sorted(models.items())],
            **totals,
        )
