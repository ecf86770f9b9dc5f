"""Stub engines and a router that know what a deployment serves (common/serves.py).

EmbeddingStubEngine answers an embedding request (sampling.embedding set) as
the real engine's contract says: one message with the vector, usage and
FINISH_REASON_STOP; its vector is a function of the prompt's token ids, so a
test can tell whose it is. Asked for what it does not serve, it answers
INVALID_ARGUMENT, as the real engine does. ServesStubRouter reports its
`serves` in every deployment's stats. `with_serves` puts both into the
gateway tests' make_cluster.
"""

import asyncio
from dataclasses import dataclass, field

import grpc

from maas.v1 import common_pb2, engine_pb2
from maas_services.common.serves import EMBED, GENERATE, KINDS
from tests.integration.gateway import conftest
from tests.integration.gateway.stubs import StubEngine, StubRouter


def stub_vector(token_ids, dimensions: int = 0) -> list[float]:
    """The stub's embedding of a prompt: its first id, its length, then 0.5s."""
    vector = [float(token_ids[0]), float(len(token_ids)), 0.5, 0.25]
    return vector[:dimensions] if dimensions else vector


class EmbeddingStubEngine(StubEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.serves = list(KINDS)
        # Each embedding's time in the "engine".
        self.embed_delay = 0.0
        self.embedded: list[engine_pb2.GenerateRequest] = []
        self.embedding_now = 0
        self.embedding_peak = 0

    async def Generate(self, request, context):
        embeds = request.sampling.HasField("embedding")
        wanted = EMBED if embeds else GENERATE
        if wanted not in self.serves:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"this engine does not serve {wanted}"
            )
        if not embeds:
            async for response in super().Generate(request, context):
                yield response
            return
        self.embedded.append(request)
        self.embedding_now += 1
        self.embedding_peak = max(self.embedding_peak, self.embedding_now)
        try:
            await asyncio.sleep(self.embed_delay)
        finally:
            self.embedding_now -= 1
        prompt = len(request.prompt_token_ids)
        yield engine_pb2.GenerateResponse(
            request_id=request.request_id,
            finish_reason=common_pb2.FINISH_REASON_STOP,
            usage=common_pb2.Usage(prompt_tokens=prompt, completion_tokens=0),
            computed_prompt_tokens=prompt,
            embedding=stub_vector(request.prompt_token_ids, request.sampling.embedding.dimensions),
        )


@dataclass
class ServesStubRouter(StubRouter):
    # What every deployment's ready replicas serve, as the router reports it.
    serves: list[str] = field(default_factory=lambda: list(KINDS))

    async def GetPoolStats(self, request, context):
        stats = await super().GetPoolStats(request, context)
        for deployment in stats.deployments:
            deployment.serves[:] = self.serves
        return stats


def with_serves(monkeypatch) -> None:
    """make_cluster builds these stubs instead of the plain ones."""
    monkeypatch.setattr(conftest, "StubEngine", EmbeddingStubEngine)
    monkeypatch.setattr(conftest, "StubRouter", ServesStubRouter)
