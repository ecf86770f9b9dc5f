"""The embeddings checks against a small fake /embeddings: a correct one passes,
each known defect fails the check it breaks (and a server without the route is
"not offered")."""

import base64
import json
import struct

import httpx
import pytest

from maas_tools.conformance.registry import all_checks, run_one
from maas_tools.conformance.result import Outcome
from maas_tools.conformance.target import Options, Target

VECTORS = [[0.6, 0.8, 0.0], [0.0, 0.28, -0.96]]
CHECKS = ("embeddings", "embeddings_base64")


def fake_embeddings(defect: str = ""):
    """An httpx handler for GET /models and POST /embeddings with `defect`."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        if defect == "absent":
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        body = json.loads(request.content)
        packed = body.get("encoding_format") == "base64"
        data = []
        for index, vector in enumerate(VECTORS[: len(body["input"])]):
            embedding = list(vector)
            if packed:
                order = ">" if defect == "big_endian" else "<"
                kind = "d" if defect == "float64" else "f"
                raw = struct.pack(f"{order}{len(vector)}{kind}", *vector)
                embedding = base64.b64encode(raw).decode()
            position = 0 if defect == "index_zero" else index
            data.append({"object": "embedding", "index": position, "embedding": embedding})
        tokens = 12
        total = tokens + 5 if defect == "completion_counted" else tokens
        usage = {"prompt_tokens": tokens, "total_tokens": total}
        return httpx.Response(
            200, json={"object": "list", "data": data, "model": "m", "usage": usage}
        )

    return handle


class FakeTarget(Target):
    def __init__(self, defect: str):
        self._handler = fake_embeddings(defect)
        super().__init__(Options("http://fake/v1"))

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, transport=httpx.MockTransport(self._handler))


def outcomes(defect: str) -> dict[str, Outcome]:
    target = FakeTarget(defect)
    try:
        chosen = [c for c in all_checks() if c.group == "endpoints" and c.name in CHECKS]
        return {c.name: run_one(target, c).outcome for c in chosen}
    finally:
        target.close()


def test_a_correct_server_passes_both():
    assert outcomes("") == {name: Outcome.PASS for name in CHECKS}


def test_a_server_without_the_route_is_not_offered():
    assert outcomes("absent") == {name: Outcome.NOT_OFFERED for name in CHECKS}


@pytest.mark.parametrize("defect", ["big_endian", "float64"])
def test_base64_that_is_not_little_endian_float32_fails_only_that_check(defect):
    assert outcomes(defect) == {"embeddings": Outcome.PASS, "embeddings_base64": Outcome.FAIL}


@pytest.mark.parametrize("defect", ["index_zero", "completion_counted"])
def test_a_wrong_index_or_usage_fails_both(defect):
    assert outcomes(defect) == {name: Outcome.FAIL for name in CHECKS}
