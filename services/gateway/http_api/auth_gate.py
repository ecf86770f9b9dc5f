"""ASGI middleware: check the API key of every POST before its body is read.

A FastAPI dependency would run after FastAPI has read and json-decoded the
body, which is where an unauthenticated body does its harm (a 4 MiB body of
`[[],[],...]` decodes to ~95 MB), so the key is checked here, from the
headers alone, and a refused request is answered before one body byte is
read. The principal reaches the routes as `request.state.principal`.
GET routes (/v1/models, /v1/usage) have no body and authenticate in the route.

A completion from a tenant the limiter still refuses for RPM (until its
Retry-After, see RateLimiter.refuse_blocked) is answered here too: its body
would be read, validated and built into a request only to get the same 429.
"""

from starlette.types import ASGIApp, Receive, Scope, Send

from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.refusal import refuse
from maas_services.gateway.admission.auth import Authenticator
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.http_api.http_metrics import RESPONSES

COMPLETION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"}
)


class AuthGate:
    def __init__(self, app: ASGIApp, auth: Authenticator, limiter: RateLimiter):
        self._app = app
        self._auth = auth
        self._limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        authorization = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None
        )
        try:
            principal = await self._auth.authenticate(authorization)
        except APIError as error:
            await refuse(send, error)
            return
        if scope["path"] in COMPLETION_PATHS:
            try:
                self._limiter.refuse_blocked(principal.tenant, 1)
            except APIError as error:
                RESPONSES.labels(scope["path"], error.status).inc()
                await refuse(send, error)
                return
        scope.setdefault("state", {})["principal"] = principal
        await self._app(scope, receive, send)
