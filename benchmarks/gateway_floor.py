"""What the gateway's libraries cost per request on this machine, alone:
`python -m benchmarks.gateway_floor --output benchmarks/results/gateway_floor.json`.

The gateway's aim is 2 CPU-ms per admitted stream. This measures, in one
run, the CPU the layers it is built on take for the same shape of work, with
nothing of the gateway's own above them:

- http_bare: uvicorn over httptools, a raw ASGI app that answers a POST with
  an SSE stream of FRAMES chunks and [DONE];
- http_starlette: the same stream as the gateway's EventStream from a
  Starlette route, no middleware;
- http_fastapi: the same from a FastAPI route that validates the gateway's
  ChatCompletionRequest body;
- http_gateway_stack: that route behind the gateway's HTTP protocol,
  TracingMiddleware and BodyGuard (AuthGate left out: it needs tenants in
  Redis; its cached-key path is a dict lookup);
- grpc_unary / grpc_stream: one grpc.aio unary call, and one server stream of
  FRAMES messages, on the gateway's channel options (client side CPU, every
  thread of this process);
- redis_evalsha: one redis-py EVALSHA of a one-line script (client side);
- asyncio_task: one task created and awaited;
- http_bare_paced: the bare app's stream paced as gateway_stream_bench's
  one-clock engine (256 frames, one per 10-30 ms step for every stream) at 32
  and 64 streams at once: the server's CPU per frame, the floor under the
  gateway's CPU per streamed token.

Servers run in child processes pinned to core 0 (CPU read from every thread's
/proc schedstat, in ns); the clients run here on the other cores. The HTTP
client is raw keep-alive HTTP/1.1, so it costs far less than the server.
"""

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from benchmarks.gateway_bench import pin
from benchmarks.machine import machine
from benchmarks.results_file import report
from maas_services.common.grpc_client import OPTIONS
from maas_services.common.redis_client import open_redis
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process

FRAMES = 17  # a 16-token chat stream: the role chunk and 16 content chunks
PACED_FRAMES = 256  # a stream of gateway_stream_bench's length
CHUNK = {
    "id": "chatcmpl-0123456789abcdef",
    "object": "chat.completion.chunk",
    "created": 1764000000,
    "model": "stub-fast",
    "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}],
}
BODY = json.dumps(
    {
        "model": "stub-fast",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
        "stream": True,
    }
).encode()
MESSAGE = b"\x08\x01\x12\x05 word" + bytes(24)  # about a GenerateResponse's size
PATH = "/v1/chat/completions"
REQUEST = (
    f"POST {PATH} HTTP/1.1\r\nHost: floor\r\nContent-Type: application/json\r\n"
    f"Content-Length: {len(BODY)}\r\n\r\n"
).encode() + BODY


# -- servers (child processes) ------------------------------------------------


def frames():
    import msgspec

    encode = msgspec.json.Encoder().encode
    return [b"data: " + encode(CHUNK) + b"\n\n" for _ in range(FRAMES)] + [b"data: [DONE]\n\n"]


def bare_app(paced: bool = False):
    """A raw ASGI app answering a POST with an SSE stream. `paced`: gateway_stream_bench's
    one-clock stream instead, PACED_FRAMES frames, each after the end of a 10-30 ms step
    every stream shares: what uvicorn and one socket write per token cost, alone."""
    import random

    from tests.integration.gateway.stubs import SharedStep

    sse = [frames()[1]] * PACED_FRAMES + frames()[-1:] if paced else frames()
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/event-stream")],
    }
    steps = SharedStep(lambda: random.uniform(0.01, 0.03))

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send(start)
        for frame in sse:
            if paced:
                await steps.wait()
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def starlette_app():
    from starlette.applications import Starlette
    from starlette.routing import Route

    from maas_services.gateway.http_api.http_stream import EventStream

    sse = frames()

    async def events():
        for frame in sse:
            yield frame

    async def chat(request):
        await request.body()
        return EventStream(events(), media_type="text/event-stream")

    return Starlette(routes=[Route(PATH, chat, methods=["POST"])])


def fastapi_app(middleware: bool = False):
    from fastapi import APIRouter, FastAPI
    from fastapi.responses import Response

    from maas_services.common.openai_api.schemas import ChatCompletionRequest
    from maas_services.gateway.admission.body_budget import BodyBudget, BudgetLimits
    from maas_services.gateway.admission.tenants import Principal, Tenant
    from maas_services.gateway.http_api.body_guard import BodyGuard
    from maas_services.gateway.http_api.http_stream import EventStream
    from maas_services.gateway.http_api.tracing_middleware import TracingMiddleware

    sse = frames()
    router = APIRouter()

    async def events():
        for frame in sse:
            yield frame

    @router.post(PATH)
    async def chat(body: ChatCompletionRequest) -> Response:
        return EventStream(events(), media_type="text/event-stream")

    app = FastAPI(
        docs_url=None,
        redoc_url=None,
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.include_router(router)
    if not middleware:
        return app
    budget = BodyBudget(BudgetLimits(64 << 20, 16 << 20, 4 << 20, 5.0))
    app.add_middleware(BodyGuard, max_bytes=4 << 20, read_timeout=30.0, budget=budget)
    app.add_middleware(TracingMiddleware)
    principal = Principal(Tenant(name="floor"), "floor-key")

    async def authenticated(scope, receive, send):
        # AuthGate's part without Redis: the principal BodyGuard charges.
        scope.setdefault("state", {})["principal"] = principal
        await app(scope, receive, send)

    return authenticated


def serve_http(kind: str, port: int) -> None:
    import uvicorn

    apps = {
        "bare": bare_app,
        "paced": lambda: bare_app(paced=True),
        "starlette": starlette_app,
        "fastapi": fastapi_app,
        "gateway_stack": lambda: fastapi_app(middleware=True),
    }
    http = "httptools"
    if kind == "gateway_stack":
        from functools import partial

        from maas_services.gateway.http_api.http_protocol import (
            ConnectionLimits,
            GuardedHttpProtocol,
        )

        http = partial(GuardedHttpProtocol, limits=ConnectionLimits(1024, 65536, 30.0))
    uvicorn.run(
        apps[kind](),
        host="127.0.0.1",
        port=port,
        http=http,
        ws="none",
        access_log=False,
        log_level="warning",
        lifespan="off",
    )


async def serve_grpc(port: int) -> None:
    async def unary(request, context):
        return MESSAGE

    async def stream(request, context):
        for _ in range(FRAMES):
            yield MESSAGE

    handler = grpc.method_handlers_generic_handler(
        "floor.Floor",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


# -- measuring ----------------------------------------------------------------


def cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of every thread of `pid` so far."""
    total = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended
            total += int(Path(f"/proc/{pid}/task/{thread}/schedstat").read_text().split()[0])
    return total


def child(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.gateway_floor", *argv])


async def http_stream(reader, writer) -> None:
    writer.write(REQUEST)
    tail = b""
    while not tail.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's last chunk
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        tail = (tail + data)[-7:]


async def connect(port: int):
    """(reader, writer) of a connection to a server child once it listens."""
    for _ in range(300):
        try:
            return await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
    raise ConnectionError(f"nothing listens on port {port}")


async def measure_http(kind: str, runs: int) -> dict:
    port = free_port()
    server = child(["--serve", kind, "--port", str(port)])
    try:
        reader, writer = await connect(port)
        pin(server.pid, {0})
        for _ in range(50):
            await http_stream(reader, writer)
        walls = []
        before = cpu_ns(server.pid)
        for _ in range(runs):
            started = time.perf_counter()
            await http_stream(reader, writer)
            walls.append(time.perf_counter() - started)
        used = cpu_ns(server.pid) - before
        writer.close()
    finally:
        server.terminate()
        server.wait(10)
    return result(used / runs, walls, runs, "server")


async def measure_paced(streams: int) -> dict:
    """Server CPU per frame of `streams` paced SSE streams at once (bare_app, paced)."""
    port = free_port()
    server = child(["--serve", "paced", "--port", str(port)])
    try:
        connections = [await connect(port) for _ in range(streams)]
        pin(server.pid, {0})
        before = cpu_ns(server.pid)
        await asyncio.gather(*(http_stream(reader, writer) for reader, writer in connections))
        used = cpu_ns(server.pid) - before
        for _, writer in connections:
            writer.close()
    finally:
        server.terminate()
        server.wait(10)
    frames_sent = streams * PACED_FRAMES
    return {
        "streams": streams,
        "frames": frames_sent,
        "cpu_ms_per_frame": round(used / frames_sent / 1e6, 4),
    }


def result(ns_each: float, walls: list[float], runs: int, side: str) -> dict:
    return {
        "cpu_ms_each": round(ns_each / 1e6, 4),
        "wall_ms_p50": round(statistics.median(walls) * 1000, 4),
        "runs": runs,
        "cpu_of": side,
    }


async def measure_client(call, runs: int) -> dict:
    """CPU of this whole process (grpc's threads included) per call."""
    for _ in range(50):
        await call()
    walls = []
    before = cpu_ns(os.getpid())
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        walls.append(time.perf_counter() - started)
    return result((cpu_ns(os.getpid()) - before) / runs, walls, runs, "client")


async def measure_grpc(runs: int) -> dict:
    port = free_port()
    server = child(["--serve", "grpc", "--port", str(port)])
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
    try:
        await asyncio.wait_for(channel.channel_ready(), 60)
        pin(server.pid, {0})
        unary = channel.unary_unary("/floor.Floor/Unary")
        stream = channel.unary_stream("/floor.Floor/Stream")

        async def one_unary():
            await unary(b"x", timeout=10)

        async def one_stream():
            call = stream(b"x", timeout=10)
            while await call.read() is not grpc.aio.EOF:
                pass

        return {
            "grpc_unary": await measure_client(one_unary, runs),
            "grpc_stream": await measure_client(one_stream, runs),
        }
    finally:
        await channel.close()
        server.terminate()
        server.wait(10)


async def measure_redis(runs: int) -> dict:
    with tempfile.TemporaryDirectory() as state:
        port = free_port()
        process = redis_process(Path(state), port)
        process.start()
        url = f"redis://127.0.0.1:{port}/0"
        redis = open_redis(url)
        try:
            await wait_ready(process, url, 30)
            pin(process.pid, {0})
            sha = await redis.script_load("return 1")
            return await measure_client(lambda: redis.evalsha(sha, 1, "floor"), runs)
        finally:
            await redis.aclose()
            process.stop(10)


async def measure_task(runs: int) -> dict:
    async def nothing():
        return None

    return await measure_client(lambda: asyncio.ensure_future(nothing()), runs)


async def run(args) -> dict:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() > 1:
        os.sched_setaffinity(0, set(range(1, os.cpu_count())))
    results = {}
    for kind in ("bare", "starlette", "fastapi", "gateway_stack"):
        results[f"http_{kind}"] = await measure_http(kind, args.runs)
    results.update(await measure_grpc(args.runs))
    results["redis_evalsha"] = await measure_redis(args.runs)
    results["asyncio_task"] = await measure_task(args.runs)
    # The floor under gateway_stream_bench's CPU per streamed token.
    results["http_bare_paced"] = [await measure_paced(streams) for streams in args.paced_streams]
    return {"machine": machine(), "frames": FRAMES, "floor": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--paced-streams", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "grpc":
        asyncio.run(serve_grpc(args.port))
        return
    if args.serve:
        serve_http(args.serve, args.port)
        return
    results = asyncio.run(run(args))
    report(results, args.output)


if __name__ == "__main__":
    main()
