"""The HTTP front's response counter, shared by the routes and the error handlers."""

from prometheus_client import Counter

RESPONSES = Counter(
    "maas_gateway_http_responses", "HTTP responses by route and status", ["route", "status"]
)
