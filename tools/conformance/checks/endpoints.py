"""The rest of the surface, probed: /responses, /embeddings, /batches and /files.

A route the server does not have (404, 405, 501) is "not offered"; an
embeddings route may also refuse (4xx) for a model that cannot embed, which
is that deployment not offering it. Where a route answers, its object holds
to the reference's shape. Batches are read (the list), not run: a batch may
take up to its 24 h window.
"""

import httpx

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import NotOffered, expect
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


@check("endpoints", "embeddings")
def embeddings(target: Target) -> str:
    inputs = ["The cat sat on the mat.", "Stock markets fell today."]
    reply = target.post("/embeddings", target.body(input=inputs))
    if reply.status_code in ABSENT:
        raise NotOffered(f"POST /embeddings: HTTP {reply.status_code}")
    refused(reply, "POST /embeddings")
    body = json_body(reply)
    expect(body.get("object") == "list", f"object is 'list', got {body.get('object')!r}")
    data = body.get("data") or []
    expect(len(data) == len(inputs), f"one embedding per input: {len(data)} for {len(inputs)}")
    sizes = set()
    for i, item in enumerate(data):
        expect(item.get("object") == "embedding", f"data[{i}].object is 'embedding'")
        expect(item.get("index") == i, f"data[{i}].index is {i}, got {item.get('index')!r}")
        vector = item.get("embedding")
        expect(
            isinstance(vector, list) and vector and all(isinstance(x, int | float) for x in vector),
            f"data[{i}].embedding is a list of numbers (encoding_format float)",
        )
        sizes.add(len(vector))
    expect(len(sizes) == 1, f"every embedding has one dimension, got {sorted(sizes)}")
    usage = body.get("usage") or {}
    expect(isinstance(usage.get("prompt_tokens"), int), "usage.prompt_tokens is an integer")
    return f"dimension {sizes.pop()}"


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
