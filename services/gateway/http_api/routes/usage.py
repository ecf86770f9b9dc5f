"""GET /v1/usage: the key's tenant's usage, from billing."""

from fastapi import APIRouter

from maas_services.gateway.http_api.routes.deps import GatewayDep, PrincipalDep
from maas_services.gateway.usage.usage_api import usage_report

router = APIRouter()


@router.get("/v1/usage")
async def usage(
    who: PrincipalDep,
    gw: GatewayDep,
    start: str | None = None,
    end: str | None = None,
    granularity: str | None = None,
):
    return await usage_report(gw.billing, who.tenant.name, start, end, granularity)
