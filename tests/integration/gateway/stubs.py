"""Stand-ins for an engine, the router and the tokenizer, speaking their real gRPC protocols.

They let gateway tests and the gateway benchmark control what no real engine
does on demand: fail, hang before the first token, stream a chosen text in
chosen chunks, and report exactly when the gateway cancelled (or aborted) a
request.
Run one as a process (for the benchmark): python -m tests.integration.gateway.stubs
--port P --model-id M.
"""

import argparse
import asyncio
import functools
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from maas.v1 import (
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)
from maas_services.common.engine_metadata import SCHEDULED
from maas_services.common.generate_mux import GenerateMux


def token_logprob(position: int, text: str) -> engine_pb2.TokenLogprob:
    """The stub's logprob entry for its token at `position`: distinct per token."""
    logprob = -0.01 * (position + 1)
    return engine_pb2.TokenLogprob(
        token_id=position + 1,
        token=text,
        logprob=logprob,
        top_logprobs=[engine_pb2.TopLogprob(token_id=position + 1, token=text, logprob=logprob)],
    )


def joined(
    earlier: engine_pb2.GenerateResponse, later: engine_pb2.GenerateResponse
) -> engine_pb2.GenerateResponse:
    """One message for two: the tokens, text and logprobs of both, the rest of `later`."""
    merged = engine_pb2.GenerateResponse()
    merged.CopyFrom(earlier)
    merged.MergeFrom(later)  # appends repeated fields, overwrites set scalars
    merged.text = earlier.text + later.text
    return merged


class SharedStep:
    """One clock for everyone waiting on it, as a real engine's model step is for its
    running requests: wait() ends with the step under way, or with a new one of
    `pause()` seconds when none is. Also gateway_floor's paced bare app's clock."""

    def __init__(self, pause: Callable[[], float]):
        self._pause = pause
        self._step: asyncio.Future | None = None

    async def wait(self) -> None:
        if self._step is None or self._step.done():
            loop = asyncio.get_running_loop()
            self._step = loop.create_future()
            loop.call_later(self._pause(), self._step.set_result, None)
        await asyncio.shield(self._step)


class StubEngine(engine_pb2_grpc.EngineServicer):
    def __init__(
        self, model: str, chunks: list[str], delay: float = 0.0, delay_max: float | None = None
    ):
        self.model = model
        self.chunks = chunks
        self.delay = delay
        # Paced like a real engine: each token after a uniform wait in [delay, delay_max].
        self.delay_max = delay_max
        # Tokens sent back to back, then one pause (`delay`): what an engine
        # that merges nothing sends when several tokens are ready together.
        self.burst = 1
        # Send each burst as one message, as an engine that merges ready tokens does.
        self.merged = False
        # Pace every request by one clock, a token each for all of them per
        # pause, as a real engine's steps do; else each request keeps its own.
        self.stepped = False
        self._steps = SharedStep(self._pause)
        # Send each token's logprob entry when the request asks for logprobs.
        self.logprobs = False
        self.fail: grpc.StatusCode | None = None
        # Say the request entered a model step before failing or hanging.
        self.scheduled = False
        self.hang = False
        # Stream this many chunks, then nothing more until cancelled or aborted.
        self.stall_after: int | None = None
        self.served = 0
        self.active: set[str] = set()
        # When the gateway stopped each request: a cancel, or an Abort.
        self.cancelled_at: dict[str, float] = {}
        # request id -> set by Abort: a hanging or stalled request ends with an
        # "abort" finish, as an engine's does (the prompt computed only if scheduled).
        self._aborts: dict[str, asyncio.Event] = {}
        self.priorities: list[int] = []
        # (tenant, share_prefix_cache) of each request: whose cache it may hit.
        self.cache_scopes: list[tuple[str, bool]] = []
        # LoRA adapters loaded (a Generate naming another is NOT_FOUND), the
        # adapter of each request served, each LoadAdapter's (name, source), and
        # while set, an event every LoadAdapter waits for.
        self.adapters: set[str] = set()
        self.adapters_served: list[str] = []
        self.loads: list[tuple[str, str]] = []
        self.load_gate: asyncio.Event | None = None
        self._mux = GenerateMux(self.Generate)

    async def GenerateMany(self, request_iterator, context):
        async for events in self._mux.serve(request_iterator, context):
            yield events

    async def Generate(self, request, context):
        if self.scheduled:
            await context.send_initial_metadata(SCHEDULED)
        if self.fail is not None:
            await context.abort(self.fail, "stub engine told to fail")
        if request.adapter and request.adapter not in self.adapters:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"adapter {request.adapter!r}")
        self.adapters_served.append(request.adapter)
        self.served += 1
        self.priorities.append(request.priority)
        self.cache_scopes.append((request.tenant, request.share_prefix_cache))
        self.active.add(request.request_id)
        limit = request.sampling.max_tokens or len(self.chunks)
        stop = self._aborts[request.request_id] = asyncio.Event()
        try:
            if self.hang:
                await stop.wait()
                yield self._aborted(request, 0)
                return
            held = None  # the burst's tokens so far, when merged
            for i, text in enumerate(self.chunks[:limit]):
                if i == self.stall_after:
                    await stop.wait()
                    yield self._aborted(request, i)
                    return
                if self.delay and i % self.burst == 0:
                    await (self._steps.wait() if self.stepped else asyncio.sleep(self._pause()))
                response = engine_pb2.GenerateResponse(
                    request_id=request.request_id, token_ids=[i + 1], text=text
                )
                if self.logprobs and request.sampling.logprobs:
                    response.logprobs.append(token_logprob(i, text))
                if i == min(limit, len(self.chunks)) - 1:
                    response.finish_reason = (
                        common_pb2.FINISH_REASON_LENGTH
                        if limit < len(self.chunks)
                        else common_pb2.FINISH_REASON_STOP
                    )
                    response.usage.CopyFrom(
                        common_pb2.Usage(
                            prompt_tokens=len(request.prompt_token_ids), completion_tokens=i + 1
                        )
                    )
                if self.merged:
                    held = response if held is None else joined(held, response)
                    if (i + 1) % self.burst and not response.finish_reason:
                        continue
                    response, held = held, None
                yield response
        except asyncio.CancelledError:
            self.cancelled_at[request.request_id] = time.monotonic()
            raise
        finally:
            self.active.discard(request.request_id)
            self._aborts.pop(request.request_id, None)

    def _pause(self) -> float:
        if self.delay_max is None:
            return self.delay
        return random.uniform(self.delay, self.delay_max)

    def _aborted(self, request, completion_tokens: int) -> engine_pb2.GenerateResponse:
        self.cancelled_at[request.request_id] = time.monotonic()
        prompt = len(request.prompt_token_ids)
        return engine_pb2.GenerateResponse(
            request_id=request.request_id,
            finish_reason=common_pb2.FINISH_REASON_ABORT,
            usage=common_pb2.Usage(prompt_tokens=prompt, completion_tokens=completion_tokens),
            computed_prompt_tokens=prompt if self.scheduled or completion_tokens else 0,
        )

    async def Abort(self, request, context):
        stop = self._aborts.get(request.request_id)
        if stop is not None:
            stop.set()
        return engine_pb2.AbortResponse(found=stop is not None)

    async def GetLoad(self, request, context):
        return engine_pb2.LoadReport(
            model=self.model,
            running=len(self.active),
            max_num_seqs=64,
            max_model_len=2048,
        )

    async def LoadAdapter(self, request, context):
        self.loads.append((request.name, request.source))
        if self.load_gate is not None:
            await self.load_gate.wait()
        self.adapters.add(request.name)
        return engine_pb2.AdapterStatus(name=request.name, rank=8, source=request.source)

    async def StreamKvEvents(self, request, context):
        # No prefix cache here: keep the stream open and quiet.
        await asyncio.Event().wait()
        yield engine_pb2.KvEventBatch()


@dataclass
class StubRouter(router_pb2_grpc.RouterServicer):
    """Round-robin over (endpoint id, address, model), honouring exclusions."""

    endpoints: list[tuple[str, str, str]]
    picks: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    cache_scopes: list[tuple[str, bool]] = field(default_factory=list)
    # model -> the LoRA adapters its pool reports loaded (DeploymentStats.adapters).
    adapters: dict[str, list[str]] = field(default_factory=dict)
    adapters_picked: list[str] = field(default_factory=list)
    _turn: itertools.count = field(default_factory=itertools.count)

    async def Pick(self, request, context):
        candidates = [
            e
            for e in self.endpoints
            if e[2] == request.model and e[0] not in request.exclude_endpoint_ids
        ]
        if not candidates:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no endpoint left")
        endpoint_id, address, _ = candidates[next(self._turn) % len(candidates)]
        self.picks.append(endpoint_id)
        self.sessions.append(request.session_id)
        self.cache_scopes.append((request.tenant, request.share_prefix_cache))
        self.adapters_picked.append(request.adapter)
        return router_pb2.PickResponse(endpoint_id=endpoint_id, address=address)

    async def Release(self, request, context):
        # What an older gateway sent at each request's end; the router ignores it.
        self.releases.append(request.request_id)
        return router_pb2.ReleaseResponse()

    async def GetPoolStats(self, request, context):
        models = sorted({e[2] for e in self.endpoints})
        return router_pb2.PoolStats(
            deployments=[
                router_pb2.DeploymentStats(
                    model=model,
                    replicas=[
                        router_pb2.ReplicaStats(
                            endpoint_id=e[0], address=e[1], ready=True, max_num_seqs=64
                        )
                        for e in self.endpoints
                        if e[2] == model
                    ],
                    adapters=self.adapters.get(model, []),
                )
                for model in models
            ]
        )


class StubTokenizer(tokenizer_pb2_grpc.TokenizerServicer):
    """Token-id prompts come back as they are; any text or chat is three tokens.

    `refuse`: (code, message) to abort every call with, as the real tokenizer
    does for a prompt past the context length. `on_call`: awaited first in
    every call, to look at what the gateway has done before tokenizing.
    """

    def __init__(self, max_model_len: int = 2048):
        self.max_model_len = max_model_len
        self.refuse: tuple[grpc.StatusCode, str] | None = None
        self.on_call: Callable[[], Awaitable[None]] | None = None

    async def _encoded(self, token_ids, context) -> tokenizer_pb2.EncodeResponse:
        if self.on_call is not None:
            await self.on_call()
        if self.refuse is not None:
            await context.abort(*self.refuse)
        return tokenizer_pb2.EncodeResponse(
            token_ids=list(token_ids) or [1, 2, 3], max_model_len=self.max_model_len
        )

    async def Encode(self, request, context):
        return await self._encoded(request.token_ids, context)

    async def RenderChat(self, request, context):
        return await self._encoded((), context)


async def start(servicer, add_to_server, port: int = 0) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add_to_server(servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, f"127.0.0.1:{bound}"


async def _serve(args) -> None:
    chunks = [f" tok{i}" for i in range(args.tokens)]
    engine = StubEngine(args.model_id, chunks, args.delay, args.delay_max)
    engine.burst, engine.merged, engine.stepped = args.burst, args.merged, args.stepped
    if args.no_generate_many:
        # An engine from before GenerateMany: the gateway makes a call per request.
        engine.GenerateMany = functools.partial(engine_pb2_grpc.EngineServicer.GenerateMany, engine)
    server, _ = await start(engine, engine_pb2_grpc.add_EngineServicer_to_server, args.port)
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-id", default="stub-model")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--delay-max", type=float, help="pace each token in [delay, delay-max]")
    parser.add_argument("--burst", type=int, default=1, help="tokens sent after each pause")
    parser.add_argument("--merged", action="store_true", help="each burst in one message")
    parser.add_argument("--stepped", action="store_true", help="one pace for all requests")
    parser.add_argument("--no-generate-many", action="store_true", help="answer it UNIMPLEMENTED")
    asyncio.run(_serve(parser.parse_args()))
