"""GET /models and GET /models/{model}: the list object and the model object.

A model id is sent percent-encoded (a "/" too), as the openai SDK sends it.
"""

from urllib.parse import quote

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import expect
from maas_tools.conformance.shapes import envelope
from maas_tools.conformance.target import Target, json_body


def model_object(item: object, where: str) -> None:
    expect(isinstance(item, dict), f"{where}: a model is an object")
    expect(isinstance(item.get("id"), str) and item["id"], f"{where}: model id is a string")
    expect(item.get("object") == "model", f"{where}: object is 'model', got {item.get('object')!r}")
    expect(isinstance(item.get("created"), int), f"{where}: created is an integer")
    expect(isinstance(item.get("owned_by"), str), f"{where}: owned_by is a string")


@check("models", "list")
def list_models(target: Target) -> str:
    reply = target.http.get("/models")
    expect(reply.status_code == 200, f"GET /models: HTTP {reply.status_code}")
    body = json_body(reply)
    expect(body.get("object") == "list", f"object is 'list', got {body.get('object')!r}")
    expect(isinstance(body.get("data"), list), "data is a list")
    for item in body["data"]:
        model_object(item, "GET /models")
    ids = [m["id"] for m in body["data"]]
    expect(target.model in ids, f"the model under test {target.model!r} is not listed: {ids}")
    return f"{len(ids)} model(s)"


@check("models", "retrieve")
def retrieve_model(target: Target) -> str:
    reply = target.http.get(f"/models/{quote(target.model, safe='')}")
    expect(
        reply.status_code == 200,
        f"GET /models/{{id}} of a listed model: HTTP {reply.status_code} {reply.text[:120]}",
    )
    body = json_body(reply)
    model_object(body, "GET /models/{id}")
    expect(body["id"] == target.model, f"id is {target.model!r}, got {body['id']!r}")
    missing = target.http.get("/models/conformance-no-such-model")
    expect(
        missing.status_code == 404,
        f"GET /models/{{id}} of an unknown model is 404, got HTTP {missing.status_code}",
    )
    envelope(missing, "unknown model id")
    return ""
