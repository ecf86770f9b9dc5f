"""The OpenAI-compatible HTTP API (FastAPI): middleware, error bodies, and the routers.

The routes live in routes/, one module per OpenAI route family:
chat (POST /v1/chat/completions), completions (POST /v1/completions), models
(GET /v1/models), usage (GET /v1/usage), responses (POST /v1/responses, GET and
DELETE /v1/responses/{id}), embeddings (POST /v1/embeddings), files (/v1/files,
uploads streamed by files.FileUploads), batches (/v1/batches), health (/healthz,
/health, /readyz).

Nothing here tells an unauthenticated caller more than it must: POST keys are
checked before the body is read (auth_gate.py), the body is read within the
tenant's byte budget (body_guard.py, body_budget.py), /readyz says ready or not
(the reason goes to the log), and /metrics is served on the metrics port
only, which the chart keeps off the public Service.
"""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import APIError
from maas_services.gateway.admission.body_budget import BodyBudget, BudgetLimits
from maas_services.gateway.http_api.auth_gate import AuthGate
from maas_services.gateway.http_api.body_guard import BodyGuard
from maas_services.gateway.http_api.http_metrics import RESPONSES, route_label
from maas_services.gateway.http_api.routes import (
    batches,
    chat,
    completions,
    embeddings,
    files,
    health,
    models,
    responses,
    usage,
)
from maas_services.gateway.http_api.routes.deps import Gateway
from maas_services.gateway.http_api.routes.files import FileUploads
from maas_services.gateway.http_api.tracing_middleware import TracingMiddleware
from maas_services.gateway.settings import GatewaySettings

log = get_logger(__name__)

TYPE_TAGS = {"str", "int", "float", "bool"}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def is_field_name(part: str) -> bool:
    """Union members add their type to an error's path ("list[int]", "str",
    "TextPart"); the field names are what the client needs."""
    return part.isidentifier() and not part[0].isupper() and part not in TYPE_TAGS


def validation_error(exc: RequestValidationError) -> APIError:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return APIError(400, "We could not parse the JSON body of your request.", param=None)
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(p for p in loc if p.isdigit() or is_field_name(p))
    message = first.get("msg", "invalid value")
    return APIError(400, f"Invalid value for '{param}': {message}", param=param or None)


async def _api_error(request: Request, exc: APIError):
    RESPONSES.labels(route_label(request), exc.status).inc()
    return error_response(exc)


async def _invalid(request: Request, exc: RequestValidationError):
    RESPONSES.labels(route_label(request), 400).inc()
    return error_response(validation_error(exc))


async def _http(request: Request, exc: HTTPException):
    # Unknown paths, wrong methods and bodies FastAPI could not read.
    RESPONSES.labels("other", exc.status_code).inc()
    return error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))


async def _bug(request: Request, exc: Exception):
    # A bug of ours; the client still gets an OpenAI error body.
    log.exception("unhandled_error", path=request.url.path)
    RESPONSES.labels(route_label(request), 500).inc()
    return error_response(APIError(500, "internal error", type="api_error", code="internal_error"))


def create_app(gw: Gateway) -> FastAPI:
    # FastAPI's own telemetry (0.142+) adds a server span, four operation
    # spans and OpenTelemetry metrics to every request (over a third of a
    # refused request's CPU) for what TracingMiddleware's one span and the
    # Prometheus histograms already record.
    app = FastAPI(
        title="maas gateway",
        docs_url=None,
        redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.gateway = gw
    # A Gateway built without a budget (a test's) gets the settings' defaults around its body limit.
    budget = gw.body_budget or BodyBudget(
        BudgetLimits.from_settings(GatewaySettings(max_body_bytes=gw.max_body_bytes))
    )
    app.add_middleware(
        BodyGuard,
        max_bytes=gw.max_body_bytes,
        read_timeout=gw.body_timeout_seconds,
        budget=budget,
    )
    # Between AuthGate and BodyGuard: an upload is streamed, never read whole.
    app.add_middleware(FileUploads)
    # Outside BodyGuard: the key is checked before the body is read.
    app.add_middleware(AuthGate, auth=gw.auth, limiter=gw.pipeline.limiter)
    # Added last, so outermost: the span and the timings cover every byte.
    app.add_middleware(TracingMiddleware)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(Exception, _bug)
    for family in (health, models, usage, chat, completions, responses, embeddings, files, batches):
        app.include_router(family.router)
    return app
