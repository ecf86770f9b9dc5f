"""maas.v1.Billing: usage totals, time buckets and line items for one tenant.

Callers are trusted services (the gateway asks only for the calling tenant;
the admin CLI for any); tenants never reach this port directly.
"""

import grpc

from maas.v1 import billing_pb2, billing_pb2_grpc
from maas_services.billing.ledger import DAY, HOUR, Ledger, Totals

MAX_BUCKETS = 24 * 93  # a quarter of hours
DEFAULT_ITEMS, MAX_ITEMS = 100, 1000


def totals_fields(totals: Totals) -> dict[str, int]:
    return {
        "requests": totals.requests,
        "prompt_tokens": totals.prompt_tokens,
        "cached_prompt_tokens": totals.cached_prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "cost_nano_usd": totals.cost_nano_usd,
    }


def usages(grouped: dict[str, Totals]) -> list[billing_pb2.ModelUsage]:
    """Running totals by name (a model's, or an adapter's) as ModelUsage messages."""
    return [billing_pb2.ModelUsage(model=name, **totals_fields(t)) for name, t in grouped.items()]


class BillingServicer(billing_pb2_grpc.BillingServicer):
    def __init__(self, ledger: Ledger):
        self._ledger = ledger

    async def GetUsage(self, request, context):
        if not request.tenant:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tenant is required")
        totals, models = await self._ledger.totals(request.tenant)
        adapters = await self._ledger.adapter_totals(request.tenant)
        response = billing_pb2.GetUsageResponse(
            tenant=request.tenant,
            total_tokens=totals.total_tokens,
            models=usages(models),
            adapters=usages(adapters),
            **totals_fields(totals),
        )
        if request.granularity != billing_pb2.GRANULARITY_UNSPECIFIED:
            size = HOUR if request.granularity == billing_pb2.GRANULARITY_HOUR else DAY
            if request.end <= request.start:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "end must be after start")
            if (request.end - request.start) / size > MAX_BUCKETS:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"at most {MAX_BUCKETS} buckets per query; narrow start/end",
                )
            buckets = await self._ledger.buckets(request.tenant, request.start, request.end, size)
            response.buckets.extend(
                billing_pb2.UsageBucket(start=s, **totals_fields(t)) for s, t in buckets
            )
        return response

    async def ListLineItems(self, request, context):
        if not request.tenant:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tenant is required")
        limit = request.limit or DEFAULT_ITEMS
        if not 0 < limit <= MAX_ITEMS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"limit must be in [1, {MAX_ITEMS}]"
            )
        try:
            offset = int(request.page_token or 0)
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_token is not valid")
        end = request.end or float("inf")
        items = await self._ledger.line_items(request.tenant, request.start, end, offset, limit)
        return billing_pb2.ListLineItemsResponse(
            items=[billing_pb2.LineItem(**item) for item in items],
            next_page_token=str(offset + limit) if len(items) == limit else "",
        )
