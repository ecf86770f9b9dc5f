"""The HTTP front's response counter, shared by the routes and the error handlers."""

from prometheus_client import Counter
from starlette.requests import Request

RESPONSES = Counter(
    "maas_gateway_http_responses", "HTTP responses by route and status", ["route", "status"]
)


def route_label(request: Request) -> str:
    """The matched route's template (`/v1/responses/{response_id}`), never the path a
    client sent: an id in the label would make a new series per request."""
    route = request.scope.get("route")
    return getattr(route, "path", None) or "other"
