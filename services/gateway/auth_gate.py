"""ASGI middleware: check the API key of every POST before its body is read.

A FastAPI dependency would run after FastAPI has read and json-decoded the
body, which is where an unauthenticated body does its harm (a 4 MiB body of
`[[],[],...]` decodes to ~95 MB), so the key is checked here, from the
headers alone, and a refused request is answered before one body byte is
read. The principal reaches the routes as `request.state.principal`.
GET routes (/v1/models, /v1/usage) have no body and authenticate in the route.
"""

from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway.auth import Authenticator
from services.gateway.errors import APIError
from services.gateway.refusal import refuse


class AuthGate:
    def __init__(self, app: ASGIApp, auth: Authenticator):
        self._app = app
        self._auth = auth

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
        scope.setdefault("state", {})["principal"] = principal
        await self._app(scope, receive, send)
