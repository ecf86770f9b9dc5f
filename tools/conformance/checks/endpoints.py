"""The rest of the surface, probed: /responses, /embeddings, /batches and /files.

A route the server does not have (404, 405, 501) is "not offered"; an
embeddings route may also refuse (4xx) for a model that cannot embed, which
is that deployment not offering it. Where a route answers, its object holds
to the reference's shape; an embeddings route's base64 encoding is the same
vector as its float one, and its usage counts input tokens only. Batches are
read (the list), not run: a batch may take up to its 24 h window.
"""

import base64
import binascii
import math
import struct

import httpx

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import CheckFailed, NotOffered, expect
from maas_tools.conformance.target import Target, json_body, refused

ABSENT = (404, 405, 501)


def present(reply: httpx.Response, what: str) -> dict:
    if reply.status_code in ABSENT:
        raise NotOffered(f"{what}: HTTP {reply.status_code}")
    expect(reply.status_code == 200, f"{what}: HTTP {reply.status_code} {reply.text[:160]}")
    return json_body(reply)


@check("endpoints", "responses")
def responses(target: Target) -> str:
    body = present(
        target.post("/responses", target.body(input="Say hello.", max_output_tokens=16)),
        "POST /responses",
    )
    expect(body.get("object") == "response", f"object is 'response', got {body.get('object')!r}")
    expect(isinstance(body.get("id"), str) and body["id"], "id is a non-empty string")
    expect(
        body.get("status") in ("completed", "incomplete"),
        f"status is completed or incomplete, got {body.get('status')!r}",
    )
    texts = [
        part.get("text")
        for item in body.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "output_text"
    ]
    expect(
        texts and all(isinstance(t, str) for t in texts), "output has a message with output_text"
    )
    usage = body.get("usage") or {}
    for name in ("input_tokens", "output_tokens", "total_tokens"):
        expect(isinstance(usage.get(name), int), f"usage.{name} is an integer")
    expect(
        usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"],
        "usage.total_tokens = input_tokens + output_tokens",
    )
    return texts[0][:60]


EMBED_INPUTS = ["The cat sat on the mat.", "Stock markets fell today."]


def embedded(target: Target, encoding_format: str) -> list:
    """POST /embeddings for EMBED_INPUTS: each item's `embedding`, the shape checked."""
    reply = target.post(
        "/embeddings", target.body(input=EMBED_INPUTS, encoding_format=encoding_format)
    )
    if reply.status_code in ABSENT:
        raise NotOffered(f"POST /embeddings: HTTP {reply.status_code}")
    refused(reply, "POST /embeddings")
    body = json_body(reply)
    expect(body.get("object") == "list", f"object is 'list', got {body.get('object')!r}")
    data = body.get("data") or []
    expect(
        len(data) == len(EMBED_INPUTS),
        f"one embedding per input: {len(data)} for {len(EMBED_INPUTS)}",
    )
    for i, item in enumerate(data):
        expect(item.get("object") == "embedding", f"data[{i}].object is 'embedding'")
        expect(item.get("index") == i, f"data[{i}].index is {i}, got {item.get('index')!r}")
    usage = body.get("usage") or {}
    prompt = usage.get("prompt_tokens")
    expect(isinstance(prompt, int) and prompt > 0, "usage.prompt_tokens is a positive integer")
    expect(
        usage.get("total_tokens") == prompt,
        f"usage.total_tokens = prompt_tokens (no completion), got {usage.get('total_tokens')!r}"
        f" for {prompt}",
    )
    return [item.get("embedding") for item in data]


@check("endpoints", "embeddings")
def embeddings(target: Target) -> str:
    vectors = embedded(target, "float")
    for i, vector in enumerate(vectors):
        expect(
            isinstance(vector, list) and vector and all(isinstance(x, int | float) for x in vector),
            f"data[{i}].embedding is a list of numbers (encoding_format float)",
        )
    sizes = {len(v) for v in vectors}
    expect(len(sizes) == 1, f"every embedding has one dimension, got {sorted(sizes)}")
    return f"dimension {sizes.pop()}"


@check("endpoints", "embeddings_base64")
def embeddings_base64(target: Target) -> str:
    """OpenAI's base64 is each vector's little-endian float32 bytes: the same
    vector as the float encoding (within a batch's rounding: cosine 0.999)."""
    plain = embedded(target, "float")
    packed = embedded(target, "base64")
    for i, (vector, text) in enumerate(zip(plain, packed, strict=True)):
        expect(isinstance(text, str), f"data[{i}].embedding is a base64 string")
        try:
            raw = base64.b64decode(text, validate=True)
        except binascii.Error as exc:
            raise CheckFailed(f"data[{i}].embedding is not base64: {exc}") from exc
        expect(
            len(raw) == 4 * len(vector),
            f"data[{i}]: {len(raw)} bytes for {len(vector)} float32 values",
        )
        decoded = struct.unpack(f"<{len(vector)}f", raw)
        expect(
            cosine(decoded, vector) >= 0.999,
            f"data[{i}]: base64 decoded as little-endian float32 is not the float vector",
        )
    return ""


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return dot / norms if norms else 0.0


@check("endpoints", "batches")
def batches(target: Target) -> str:
    body = present(target.http.get("/batches", params={"limit": 1}), "GET /batches")
    expect(
        body.get("object") == "list", f"GET /batches: object is 'list', got {body.get('object')!r}"
    )
    expect(isinstance(body.get("data"), list), "GET /batches: data is a list")
    for item in body["data"]:
        expect(item.get("object") == "batch", "GET /batches: every item's object is 'batch'")
    files = present(target.http.get("/files"), "GET /files")
    expect(
        files.get("object") == "list", f"GET /files: object is 'list', got {files.get('object')!r}"
    )
    expect(isinstance(files.get("data"), list), "GET /files: data is a list")
    return ""
