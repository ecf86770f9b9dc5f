"""Bad input gets OpenAI's error envelope and status, one check per input class.

The API reference's error object: {"error": {"message": str, "type": str,
"param": str | null, "code": str | null}}, all four keys present; status 400
for a request the server cannot accept as written, 404 for a model the key
cannot use (OpenAI's `model_not_found`).
"""

import httpx

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import expect
from maas_tools.conformance.shapes import ask, envelope
from maas_tools.conformance.target import Target


def refused_with(reply: httpx.Response, status: int, what: str) -> str:
    expect(
        reply.status_code == status,
        f"{what}: HTTP {status} expected, got {reply.status_code} {reply.text[:160]}",
    )
    error = envelope(reply, what)
    return f"{error['type']}/{error['code']}: {error['message'][:80]}"


def bad_chat(target: Target, status: int, what: str, **fields) -> str:
    payload = {"messages": ask("Hi"), "max_tokens": 4, **fields}
    return refused_with(target.post("/chat/completions", payload), status, what)


@check("errors", "missing_model")
def missing_model(target: Target) -> str:
    return bad_chat(target, 400, "no model field")


@check("errors", "unknown_model")
def unknown_model(target: Target) -> str:
    return bad_chat(target, 404, "an unknown model", model="conformance-no-such-model")


@check("errors", "bad_type")
def bad_type(target: Target) -> str:
    return bad_chat(target, 400, "temperature as a string", model=target.model, temperature="hot")


@check("errors", "temperature_range")
def temperature_range(target: Target) -> str:
    # The reference: temperature is between 0 and 2.
    return bad_chat(target, 400, "temperature 5", model=target.model, temperature=5)


@check("errors", "max_tokens_over_context")
def max_tokens_over_context(target: Target) -> str:
    return bad_chat(target, 400, "max_tokens 10,000,000", model=target.model, max_tokens=10**7)


@check("errors", "malformed_json")
def malformed_json(target: Target) -> str:
    reply = target.http.post(
        "/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    return refused_with(reply, 400, "a malformed JSON body")
