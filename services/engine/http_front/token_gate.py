"""ASGI middleware: the front's callers show the release's service token, before any byte of a body.

The token is the one every internal gRPC server demands
(maas_services.common.service_token), sent as OpenAI clients send a key:
`Authorization: Bearer <token>`. A gateway that fronts the engines holds it
as maas's gateway does (docs/gie.md). Refused with 401 and an OpenAI error
body before the body is read; uvicorn discards what the caller still sends.

/metrics and /health stay open, as on vLLM's server and as the gRPC health
service does: an endpoint picker scrapes /metrics with no credentials.
Unset (a test's or a laptop's engine), every caller is admitted, as by the
gRPC servers.
"""

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from maas_services.common.openai_api.errors import unauthorized
from maas_services.common.openai_api.refusal import refuse
from maas_services.common.service_token import ENV

OPEN_PATHS = frozenset({"/metrics", "/health"})
_BEARER = b"bearer "


def bearer(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            if value[: len(_BEARER)].lower() == _BEARER:
                return value[len(_BEARER) :].strip()
            return None
    return None


class TokenGate:
    def __init__(self, app: ASGIApp, token: str):
        self._app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._token or scope["path"] in OPEN_PATHS:
            await self._app(scope, receive, send)
            return
        sent = bearer(scope)
        if sent is not None and hmac.compare_digest(sent, self._token):
            await self._app(scope, receive, send)
            return
        await refuse(
            send,
            unauthorized(
                "missing or wrong service token: send 'Authorization: Bearer <token>' "
                f"with the release's service token ({ENV} of the engine)"
            ),
        )
