"""Gateway overhead and shedding: `make bench-gateway`.

Real Redis, tokenizer, router and gateway processes in front of stub engines
(tests/integration/gateway/stubs.py) that answer instantly or at a fixed
pace, so what is measured is the gateway and not the model:

1. Added latency: the same chat request through the gateway (HTTP, a tenant
   with limits, so the Lua limiter runs) against the same tokens sent straight
   to the engine's Generate; p50 and p99 of the difference in time to the
   first token and to the last, at 1 and at 8 concurrent streams, and the
   gateway's CPU time per request.
2. Steps: what each of the gateway's calls before the first token costs on
   its own (tokenizer RenderChat, router Pick, one limiter call on Redis),
   called from here the way the gateway calls them; the numbers behind
   whether tokenize and pick could overlap or merge (docs/gateway.md).
3. Shedding: a tenant over its RPM floods the gateway (pinned to one core)
   while other tenants' streams run from a paced engine; 429s per second, and
   those streams' inter-token latency against the same streams without the
   flood.
"""

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx

from benchmarks.machine import cpu_model, load_average_1m
from benchmarks.results_file import report
from maas.v1 import (
    engine_pb2,
    engine_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)
from maas_services.common.grpc_client import open_channel
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_services.common.redis_client import open_redis
from maas_services.gateway.admission.rate_limiter import RateLimiter
from maas_services.gateway.admission.tenants import Tenant, TenantStore
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
ROUTES = """
deployments:
  stub-fast: {tokenizer: %(model)s}
  stub-paced: {tokenizer: %(model)s, max_in_flight: 256}
"""


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def ms(value: float) -> float:
    return round(value * 1000, 3)


class Processes:
    def __init__(self, state: Path):
        self.state = state
        self.running: list[ManagedProcess] = []

    def start(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, self.state / "logs" / f"{name}.log")
        process.start()
        self.running.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.running):
            process.stop(10)


async def wait_engine(address: str) -> None:
    for _ in range(200):
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                await engine_pb2_grpc.EngineStub(channel).GetLoad(
                    engine_pb2.GetLoadRequest(), timeout=1
                )
            return
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"stub engine at {address} never answered")


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of a running process to `cpus`: affinity is per thread, and
    gRPC's and prometheus_client's threads, started before, keep their own."""
    for thread in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(thread), cpus)


async def start_stack(
    procs: Processes,
    tokens: int,
    pace: tuple[float, float] = (0.02, 0.02),
    paced_args: tuple[str, ...] = (),
) -> dict:
    """Redis, tokenizer, router, gateway and two stub engines: one answering at
    once, one pausing `pace` (min, max) seconds before each token (or each burst
    of tokens: `paced_args`, more of the stub's options)."""
    redis_port = free_port()
    redis = redis_process(procs.state, redis_port)
    redis.start()
    procs.running.append(redis)
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    addr = {name: f"127.0.0.1:{free_port()}" for name in ("tokenizer", "fast", "paced", "router")}
    tokenizer = procs.start(
        "tokenizer", serve_argv("tokenizer", {"port": addr["tokenizer"].split(":")[1]})
    )
    stub = [sys.executable, "-m", "tests.integration.gateway.stubs", "--tokens", str(tokens)]
    procs.start("fast", [*stub, "--port", addr["fast"].split(":")[1], "--model-id", "stub-fast"])
    procs.start(
        "paced",
        [*stub, "--port", addr["paced"].split(":")[1], "--model-id", "stub-paced"]
        + ["--delay", str(pace[0]), "--delay-max", str(pace[1]), *paced_args],
    )
    await wait_ready(redis, redis_url, 30)
    await asyncio.gather(
        wait_ready(tokenizer, addr["tokenizer"], 120),
        wait_engine(addr["fast"]),
        wait_engine(addr["paced"]),
    )
    router = procs.start(
        "router",
        serve_argv(
            "router",
            {
                "port": addr["router"].split(":")[1],
                "engines": [f"fast={addr['fast']}", f"paced={addr['paced']}"],
            },
        ),
    )
    await wait_ready(router, addr["router"], 60)
    routes = procs.state / "routes.yaml"
    routes.write_text(ROUTES % {"model": DEFAULT_MODEL_ID})
    url = f"http://127.0.0.1:{free_port()}"
    gateway = procs.start(
        "gateway",
        serve_argv(
            "gateway",
            {
                "port": url.rsplit(":", 1)[1],
                "redis-url": redis_url,
                "tokenizer-address": addr["tokenizer"],
                "router-address": addr["router"],
                "routes-file": routes,
                "log-level": "warning",
            },
        ),
    )
    await wait_ready(gateway, f"{url}/readyz", 60)
    # The gateway gets a core of its own; everything else shares the other.
    if hasattr(os, "sched_setaffinity") and os.cpu_count() > 1:
        pin(gateway.pid, {0})
        for process in procs.running:
            if process is not gateway:
                pin(process.pid, set(range(1, os.cpu_count())))
        os.sched_setaffinity(0, set(range(1, os.cpu_count())))
    return {"redis_url": redis_url, "url": url, "gateway_pid": gateway.pid, **addr}


async def tenant_key(redis_url: str, name: str, **limits) -> str:
    redis = open_redis(redis_url)
    try:
        store = TenantStore(redis)
        await store.create_tenant(name, **limits)
        return (await store.create_key(name))[1]
    finally:
        await redis.aclose()


RENDER = tokenizer_pb2.RenderChatRequest(
    model=DEFAULT_MODEL_ID,
    messages=[tokenizer_pb2.ChatMessage(**m) for m in MESSAGES],
    add_generation_prompt=True,
)


async def prompt_ids(stack: dict) -> list[int]:
    async with grpc.aio.insecure_channel(stack["tokenizer"]) as channel:
        encoded = await tokenizer_pb2_grpc.TokenizerStub(channel).RenderChat(RENDER)
    return list(encoded.token_ids)


async def direct(stack: dict, runs: int, max_tokens: int, streams: int = 1) -> tuple[list, list]:
    """Straight to the engine: `streams` clients, each sending `runs` requests in turn."""
    ids = await prompt_ids(stack)
    firsts, totals = [], []
    async with grpc.aio.insecure_channel(stack["fast"]) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)

        async def client(index: int) -> None:
            for i in range(runs):
                started = time.perf_counter()
                first = None
                request = engine_pb2.GenerateRequest(
                    request_id=f"direct-{index}-{i}",
                    model="stub-fast",
                    prompt_token_ids=ids,
                    sampling=engine_pb2.SamplingParams(max_tokens=max_tokens),
                )
                async for _ in stub.Generate(request):
                    first = first or time.perf_counter()
                firsts.append(first - started)
                totals.append(time.perf_counter() - started)

        await asyncio.gather(*(client(index) for index in range(streams)))
    return firsts, totals


async def timed(call, runs: int) -> list[float]:
    seconds = []
    for i in range(runs):
        started = time.perf_counter()
        await call(i)
        seconds.append(time.perf_counter() - started)
    return seconds


async def steps(stack: dict, runs: int) -> dict:
    """Each pre-token call alone, through the same channels and interceptors as the gateway's."""
    ids = await prompt_ids(stack)
    tokenizer_channel = open_channel(stack["tokenizer"], "bench")
    router_channel = open_channel(stack["router"], "bench")
    redis = open_redis(stack["redis_url"])
    tokenizer = tokenizer_pb2_grpc.TokenizerStub(tokenizer_channel)
    router = router_pb2_grpc.RouterStub(router_channel)
    limiter, tenant = RateLimiter(redis, 60), Tenant(name="steps", rpm=10**9, tpm=10**12)

    async def pick(i: int) -> None:
        await router.Pick(
            router_pb2.PickRequest(
                request_id=f"steps-{i}", model="stub-fast", token_ids=ids, tenant="steps"
            )
        )

    async def limit(i: int) -> None:
        await limiter.admit(tenant, f"steps-{i}", 1)

    try:
        await timed(lambda i: tokenizer.RenderChat(RENDER), 20)
        results = {
            "tokenize": await timed(lambda i: tokenizer.RenderChat(RENDER), runs),
            "pick": await timed(pick, runs),
            "limiter_call": await timed(limit, runs),
        }
    finally:
        await tokenizer_channel.close()
        await router_channel.close()
        await redis.aclose()
    return {
        **{f"{name}_p50": ms(pct(values, 50)) for name, values in results.items()},
        **{f"{name}_p99": ms(pct(values, 99)) for name, values in results.items()},
        "prompt_tokens": len(ids),
        "runs": runs,
    }


async def concurrent_gateway(client: httpx.AsyncClient, runs: int, max_tokens: int, streams: int):
    results = await asyncio.gather(
        *(through_gateway(client, runs, max_tokens, "stub-fast") for _ in range(streams))
    )
    return [x for r in results for x in r[0]], [x for r in results for x in r[1]]


def added(gateway: tuple[list, list], direct_: tuple[list, list]) -> dict:
    """Added latency: the gateway's percentiles minus the engine's own, first token and last."""
    (gw_first, gw_total), (d_first, d_total) = gateway, direct_
    return {
        "first_token_p50": ms(pct(gw_first, 50) - pct(d_first, 50)),
        "first_token_p99": ms(pct(gw_first, 99) - pct(d_first, 99)),
        "total_p50": ms(pct(gw_total, 50) - pct(d_total, 50)),
        "total_p99": ms(pct(gw_total, 99) - pct(d_total, 99)),
        "direct_total_p50": ms(pct(d_total, 50)),
        "gateway_total_p50": ms(pct(gw_total, 50)),
    }


async def through_gateway(client: httpx.AsyncClient, runs: int, max_tokens: int, model: str):
    firsts, totals, gaps = [], [], []
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True}
    for _ in range(runs):
        started = time.perf_counter()
        arrivals = []
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content":' in line:
                    arrivals.append(time.perf_counter())
        firsts.append(arrivals[0] - started)
        totals.append(time.perf_counter() - started)
        gaps += [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return firsts, totals, gaps


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def flood(url: str, key: str, seconds: float, connections: int) -> dict[int, int]:
    """Keep-alive connections sending one request after another. Raw HTTP/1.1
    rather than httpx: the client must cost far less than the server."""
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"model": "stub-fast", "messages": MESSAGES, "max_tokens": 1}).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    counts: dict[int, int] = {}
    until = time.perf_counter() + seconds

    async def connection():
        reader, writer = await asyncio.open_connection(host, int(port))
        while time.perf_counter() < until:
            writer.write(request)
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            counts[status] = counts.get(status, 0) + 1
        writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return counts


async def paced_streams(url: str, key: str, streams: int, tokens: int) -> list[float]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        runs = await asyncio.gather(
            *(through_gateway(client, 2, tokens, "stub-paced") for _ in range(streams))
        )
    return [gap for _, _, gaps in runs for gap in gaps]


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as state:
        procs = Processes(Path(state))
        try:
            stack = await start_stack(procs, args.tokens)
            limited = await tenant_key(
                stack["redis_url"], "bench", rpm=10**9, tpm=10**12, max_concurrency=10**4
            )
            flooder = await tenant_key(stack["redis_url"], "flooder", rpm=1)
            streamer = await tenant_key(stack["redis_url"], "streamer")
            headers = {"Authorization": f"Bearer {limited}"}
            async with httpx.AsyncClient(base_url=stack["url"], headers=headers) as client:
                await through_gateway(client, 20, args.tokens, "stub-fast")  # warm up
                cpu_before = cpu_seconds(stack["gateway_pid"])
                gw_first, gw_total, _ = await through_gateway(
                    client, args.runs, args.tokens, "stub-fast"
                )
                request_cpu = (cpu_seconds(stack["gateway_pid"]) - cpu_before) / args.runs
                per_stream = max(args.runs // args.streams, 2)
                many = await concurrent_gateway(client, per_stream, args.tokens, args.streams)
            await direct(stack, 20, args.tokens)
            d_first, d_total = await direct(stack, args.runs, args.tokens)
            d_many = await direct(stack, per_stream, args.tokens, args.streams)
            step_costs = await steps(stack, args.runs)

            calm = await paced_streams(stack["url"], streamer, args.streams, 50)
            cpu_before, started = cpu_seconds(stack["gateway_pid"]), time.perf_counter()
            flooding = asyncio.ensure_future(
                flood(stack["url"], flooder, args.flood_seconds, args.workers)
            )
            await asyncio.sleep(0.5)
            stormy = await paced_streams(stack["url"], streamer, args.streams, 50)
            statuses = await flooding
            elapsed = time.perf_counter() - started
            flood_cpu = cpu_seconds(stack["gateway_pid"]) - cpu_before
        finally:
            procs.stop()
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "python": platform.python_version(),
            "load_average_1m": load_average_1m(),
        },
        "added_latency_ms": {
            **added((gw_first, gw_total), (d_first, d_total)),
            # The gateway's own work per request, whatever else the machine runs.
            "gateway_cpu_ms_each": ms(request_cpu),
            "runs": args.runs,
            "tokens": args.tokens,
        },
        "added_latency_concurrent_ms": {
            **added(many, d_many),
            "streams": args.streams,
            "runs": per_stream * args.streams,
        },
        "steps_ms": step_costs,
        "rejections": {
            "per_second": round(statuses.get(429, 0) / elapsed, 1),
            # Robust to a shared machine: what one rejection costs the
            # gateway's core, and so how many one whole core would shed.
            "gateway_cpu_ms_each": round(flood_cpu * 1000 / statuses.get(429, 1), 3),
            "per_core_second": round(statuses.get(429, 0) / flood_cpu, 1),
            "gateway_cpu_share": round(flood_cpu / elapsed, 2),
            "statuses": statuses,
            "connections": args.workers,
        },
        "inter_token_latency_ms": {
            "engine_pace": 20.0,
            "without_flood_p50": ms(pct(calm, 50)),
            "without_flood_p99": ms(pct(calm, 99)),
            "during_flood_p50": ms(pct(stormy, 50)),
            "during_flood_p99": ms(pct(stormy, 99)),
            "streams": args.streams,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--workers", type=int, default=16, help="flood connections")
    parser.add_argument("--flood-seconds", type=float, default=6.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    report(results, args.output)


if __name__ == "__main__":
    main()
