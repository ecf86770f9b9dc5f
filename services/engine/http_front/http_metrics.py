"""ASGI middleware: count every answer of the front, refusals of the token gate included.

maas_engine_http_responses_total{route, status} beside the gRPC server's
maas_engine_grpc_server_handled_total: how much of an engine's traffic comes
through a GIE gateway, and how much of it is refused. Counted in the serving
process (the core's maas_engine_* series are relayed, core/metrics_relay.py).
"""

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

RESPONSES = Counter(
    "maas_engine_http_responses",
    "Responses of the engine's OpenAI HTTP front by route and status",
    ["route", "status"],
)


class CountResponses:
    def __init__(self, app: ASGIApp, routes: frozenset[str]):
        self._app = app
        # Unknown paths share one label: a caller must not grow the series.
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self._routes else "other"

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                RESPONSES.labels(route, message["status"]).inc()
            await send(message)

        await self._app(scope, receive, counted)
