"""GET /v1/usage: the calling tenant's usage from the billing ledger.

The tenant comes from the API key, never from the query, so one tenant can
never read another's usage. start/end are Unix seconds or ISO 8601 times
(UTC when no zone is given); granularity is hour or day.
"""

from datetime import UTC, datetime

import grpc

from maas.v1 import billing_pb2, billing_pb2_grpc
from maas_services.common.openai_api.errors import APIError, bad_request, from_upstream, unavailable
from maas_services.common.timestamps import parse_timestamp

GRANULARITIES = {"hour": billing_pb2.GRANULARITY_HOUR, "day": billing_pb2.GRANULARITY_DAY}


def parse_time(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        return parse_timestamp(value)
    except ValueError:
        raise bad_request(f"{name} must be Unix seconds or an ISO 8601 time", param=name) from None


def totals(message) -> dict:
    return {
        "requests": message.requests,
        "prompt_tokens": message.prompt_tokens,
        "cached_prompt_tokens": message.cached_prompt_tokens,
        "completion_tokens": message.completion_tokens,
        "total_tokens": message.prompt_tokens + message.completion_tokens,
        "cost_usd": message.cost_nano_usd / 1e9,
    }


async def usage_report(
    billing: billing_pb2_grpc.BillingStub | None,
    tenant: str,
    start: str | None,
    end: str | None,
    granularity: str | None,
) -> dict:
    if billing is None:
        raise unavailable("usage reporting is not configured on this gateway")
    if granularity is not None and granularity not in GRANULARITIES:
        raise bad_request("granularity must be hour or day", param="granularity")
    now = int(datetime.now(UTC).timestamp())
    start_s = parse_time(start, "start") or now - 86400
    end_s = parse_time(end, "end") or now + 1
    if end_s <= start_s:
        raise bad_request("end must be after start", param="end")
    request = billing_pb2.GetUsageRequest(
        tenant=tenant,
        start=start_s,
        end=end_s,
        granularity=GRANULARITIES[granularity or "day"],
    )
    try:
        reply = await billing.GetUsage(request, timeout=10)
    except grpc.aio.AioRpcError as exc:
        error: APIError = from_upstream(exc, "usage")
        raise error from exc
    return {
        "object": "usage",
        "tenant": tenant,
        "start": start_s,
        "end": end_s,
        "granularity": granularity or "day",
        "totals": totals(reply),
        "models": [{"model": m.model, **totals(m)} for m in reply.models],
        # Per LoRA adapter the tenant's requests ran with (all time, as `models`).
        "adapters": [{"adapter": a.model, **totals(a)} for a in reply.adapters],
        "data": [{"start": b.start, **totals(b)} for b in reply.buckets],
    }
