"""What the routes need, handed to them by FastAPI's dependency injection.

create_app puts the Gateway on app.state; a test can mount one router on an
app of its own with whatever Gateway it builds. Every dependency is async:
FastAPI runs a plain `def` one in a worker thread, a thread hop per request.
"""

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis

from maas.v1 import billing_pb2_grpc
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.body_budget import BodyBudget
from maas_services.gateway.admission.tenants import Principal
from maas_services.gateway.batches.service import BatchService
from maas_services.gateway.http_api.body_guard import LEASE
from maas_services.gateway.pipeline import Pipeline
from maas_services.gateway.responses.store import ResponseStore


@dataclass
class Gateway:
    pipeline: Pipeline
    auth: Authenticator
    redis: Redis
    max_body_bytes: int
    billing: billing_pb2_grpc.BillingStub | None = None
    body_timeout_seconds: float = 30.0
    # Shared with the gRPC front; None: create_app makes one from the defaults.
    body_budget: BodyBudget | None = None
    # Stored responses (/v1/responses); None: those routes answer 503.
    responses: ResponseStore | None = None
    # Files and batches (/v1/files, /v1/batches); None: those routes answer 503.
    batch_service: BatchService | None = None


async def gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def pipeline(request: Request) -> Pipeline:
    return request.app.state.gateway.pipeline


async def principal(request: Request) -> Principal:
    """POSTs were authenticated by AuthGate before their body was read; GETs have none."""
    found = getattr(request.state, "principal", None)
    if found is not None:
        return found
    return await request.app.state.gateway.auth.authenticate(request.headers.get("authorization"))


def release_body(request: Request) -> None:
    """Once the route has its ParsedRequest: the body's byte budget goes back, and
    Starlette's copies of the body (its bytes and FastAPI's json.loads of them,
    cached on the Request, which lives as long as the response) are dropped,
    so a stream does not keep them for minutes."""
    lease = request.scope.get("state", {}).get(LEASE)
    if lease is not None:
        lease.release()
    for cached in ("_body", "_json"):
        request.__dict__.pop(cached, None)


GatewayDep = Annotated[Gateway, Depends(gateway)]
PipelineDep = Annotated[Pipeline, Depends(pipeline)]
PrincipalDep = Annotated[Principal, Depends(principal)]
