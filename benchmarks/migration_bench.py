"""Streams under an engine kill schedule: how many are cut, and are tokens told = billed?

Issue #38's measurement. Three real engine processes (the real model), the
real router (least_load), tokenizer and Redis, and the gateway's request
pipeline in this process (everything a request passes but the HTTP front,
which plays no part in migration: the fronts only render the deltas). Over
`--seconds`, `--clients` clients each stream `--max-tokens` tokens (greedy,
ignore_eos) in a loop, while every `--kill-every` seconds the engine replica
with the most running requests gets kill -9 and is started again at once, as
a supervisor (or a kubelet) would. Then each stream is checked:

- cut: a stream that ended with finish_reason "error" after its first token
  instead of its `--max-tokens` tokens; refused: a request answered with an
  error before its first token (no replica ready, say);
- told = billed: the usage the client was told (the last delta's prompt and
  completion tokens, what a front puts in the usage chunk) equals the usage
  event the gateway wrote to Redis, once per request;
- maas_gateway_migrations_total{outcome} and the re-prefill counted as the
  platform's (maas_gateway_migration_prefill_tokens_total, and the sum of the
  events' migration_prefill_tokens).

`--max-migrations 0` gives the behaviour before migration, for comparison.
Each run is stored under the key `max_migrations_N` of --output, with the
machine it ran on.

    python -m benchmarks.migration_bench --output benchmarks/results/migration.json
"""

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prometheus_client import REGISTRY

from benchmarks.machine import machine
from benchmarks.results_file import update_results
from maas.v1 import engine_pb2
from maas_services.common.logging import configure_logging
from maas_services.common.model_files import DEFAULT_MODEL_ID, default_model_path
from maas_services.common.openai_api.errors import APIError
from maas_services.common.openai_api.parsed_request import ParsedRequest, TextPrompt
from maas_services.common.redis_client import open_redis
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.common.usage_event import USAGE_STREAM, UsageEvent
from maas_services.gateway.admission.tenants import Principal, Tenant
from maas_services.gateway.routing.routes_watcher import RoutesWatcher
from maas_services.gateway.server import build_pipeline
from maas_services.gateway.settings import GatewaySettings
from maas_services.gateway.upstream.upstreams import Upstreams
from maas_services.router.server import start as start_router
from maas_services.router.settings import RouterSettings
from maas_services.tokenizer.server import start_tokenizer
from maas_services.tokenizer.settings import TokenizerSettings
from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from tests.engine_replica import EngineReplica

QUESTIONS = [
    "Tell me about rivers.",
    "Describe a mountain village.",
    "Explain how bread is made.",
    "Write about the sea at night.",
]


@dataclass
class Stream:
    request_id: str
    cut: bool = False
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    seconds: float = 0.0


@dataclass
class Kill:
    at_seconds: float
    engine: str
    running: int


@dataclass
class Load:
    streams: list[Stream] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)


def killable(name: str, log_dir: Path) -> EngineReplica:
    return EngineReplica(
        name,
        log_dir,
        {
            "model-id": DEFAULT_MODEL_ID,
            "max-model-len": 1024,
            "max-num-seqs": 8,
            "torch-threads": 1,
        },
    )


async def one_stream(pipeline, prompt: list[int], max_tokens: int) -> Stream:
    request = ParsedRequest(
        request_id=f"bench-{uuid.uuid4().hex}",
        model=DEFAULT_MODEL_ID,
        prompt=TextPrompt(prompt),
        sampling=engine_pb2.SamplingParams(n=1, max_tokens=max_tokens, ignore_eos=True),
    )
    tenant = Tenant(name="bench", tpm=1_000_000_000, rpm=1_000_000, max_concurrency=1_000)
    stream, started = Stream(request.request_id), time.monotonic()
    try:
        run = await pipeline.admit(Principal(tenant, "key_bench"), request)
        async with run:
            async for delta in run.deltas:
                stream.prompt_tokens = delta.prompt_tokens
                stream.completion_tokens = delta.completion_tokens
                stream.finish_reason = delta.finish_reason or stream.finish_reason
    except APIError as exc:
        stream.error = f"{exc.status} {exc.message}"
    stream.cut = stream.finish_reason != "length"  # cut short, whatever cut it
    stream.seconds = round(time.monotonic() - started, 3)
    return stream


async def client_loop(pipeline, prompts, index: int, until: float, max_tokens: int, load: Load):
    turn = 0
    while time.monotonic() < until:
        prompt = prompts[(index + turn) % len(prompts)]
        load.streams.append(await one_stream(pipeline, prompt, max_tokens))
        turn += 1


async def kill_loop(
    replicas: list[EngineReplica], started: float, until: float, every: float, load
):
    """Every `every` seconds, kill -9 the busiest replica and start it again.

    Only while every replica answers: a kill while the last victim is still
    starting would leave one replica (or none) for the whole load, which
    measures the deployment's size, not migration."""
    restarts = []
    while time.monotonic() + every < until:
        await asyncio.sleep(every)
        loads = {r.name: await r.running() for r in replicas}
        alive = {name: n for name, n in loads.items() if n >= 0}
        if len(alive) < len(replicas):
            continue
        victim = next(r for r in replicas if r.name == max(alive, key=alive.get))
        victim.kill()
        load.kills.append(
            Kill(round(time.monotonic() - started, 1), victim.name, alive[victim.name])
        )
        await asyncio.sleep(0.5)  # the process is reaped before its ports are taken again
        restarts.append(asyncio.create_task(victim.start()))
    await asyncio.gather(*restarts, return_exceptions=True)


async def usage_events(redis_url: str, request_ids: set[str]) -> list[UsageEvent]:
    redis = open_redis(redis_url)
    try:
        return [
            UsageEvent.from_fields(fields)
            for _, fields in await redis.xrange(USAGE_STREAM)
            if fields.get("request_id") in request_ids
        ]
    finally:
        await redis.aclose()


def migration_metrics() -> dict:
    found = {}
    for metric in REGISTRY.collect():
        if metric.name in ("maas_gateway_migrations", "maas_gateway_migration_prefill_tokens"):
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    outcome = sample.labels.get("outcome")
                    found[sample.name + (f"{{{outcome}}}" if outcome else "")] = sample.value
    return found


def summary(load: Load, events: list[UsageEvent], max_tokens: int) -> dict:
    by_id: dict[str, list[UsageEvent]] = {}
    for event in events:
        by_id.setdefault(event.request_id, []).append(event)
    mismatched = []
    for s in load.streams:
        billed = [(e.prompt_tokens, e.completion_tokens) for e in by_id.get(s.request_id, [])]
        told = (s.prompt_tokens, s.completion_tokens)
        if s.completion_tokens and billed != [told]:
            mismatched.append({"request_id": s.request_id, "told": told, "billed": billed})
    cut = [s for s in load.streams if s.finish_reason == "error"]
    refused = [s for s in load.streams if s.error]
    seconds = sorted(s.seconds for s in load.streams)
    return {
        "streams": len(load.streams),
        "streams_cut": len(cut),
        "cut": [asdict(s) for s in cut],
        "refused_before_first_token": len(refused),
        "refusals": sorted({s.error for s in refused}),
        "streams_told_equals_billed": len(load.streams) - len(mismatched),
        "told_not_billed": mismatched,
        "completion_tokens_told": sum(s.completion_tokens for s in load.streams),
        "completion_tokens_billed": sum(e.completion_tokens for e in events),
        "full_streams": sum(s.completion_tokens == max_tokens for s in load.streams),
        "migration_prefill_tokens_in_events": sum(e.migration_prefill_tokens for e in events),
        "kills": [asdict(k) for k in load.kills],
        "stream_seconds_p50": seconds[len(seconds) // 2] if seconds else None,
        "stream_seconds_max": seconds[-1] if seconds else None,
    }


async def measure(args, state: Path) -> dict:
    redis_port = free_port()
    redis = redis_process(state, redis_port)
    redis.start()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    replicas = [killable(f"engine-{i}", state) for i in range(args.replicas)]
    servers, pipeline, upstreams, store = [], None, None, None
    try:
        await wait_ready(redis, redis_url, timeout=30)
        await asyncio.gather(*(r.start() for r in replicas))
        tokenizer = load_tokenizer(default_model_path())
        tok_handle, tok_pool = await start_tokenizer(TokenizerSettings(port=0), tokenizer)
        router_handle, pool = await start_router(
            RouterSettings(
                port=0,
                engines=[f"{r.name}={r.address}" for r in replicas],
                routing_policy="least_load",
            )
        )
        servers = [(tok_handle, tok_pool.shutdown), (router_handle, pool.close)]
        routes = state / "routes.yaml"
        routes.write_text("")
        settings = GatewaySettings(
            redis_url=redis_url,
            tokenizer_address=f"127.0.0.1:{tok_handle.port}",
            router_address=f"127.0.0.1:{router_handle.port}",
            usage_spool_dir=str(state / "spool"),
            max_migrations=args.max_migrations,
            hold_timeout_seconds=args.hold_seconds,
        )
        upstreams = Upstreams(settings.tokenizer_address, settings.router_address)
        store = open_redis(redis_url)
        pipeline = build_pipeline(settings, upstreams, store, RoutesWatcher(str(routes)))
        prompts = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
        load = Load()
        started = time.monotonic()
        until = started + args.seconds
        await asyncio.gather(
            *(
                client_loop(pipeline, prompts, i, until, args.max_tokens, load)
                for i in range(args.clients)
            ),
            kill_loop(replicas, started, until, args.kill_every, load),
        )
        await pipeline.background.wait()
        events = await usage_events(redis_url, {s.request_id for s in load.streams})
        result = summary(load, events, args.max_tokens)
        result["gateway_metrics"] = migration_metrics()
        return result
    finally:
        if pipeline is not None:
            await pipeline.background.wait()
        if upstreams is not None:
            await upstreams.close()
        if store is not None:
            await store.aclose()
        for handle, close in servers:
            await handle.server.stop(None)
            result = close()
            if asyncio.iscoroutine(result):
                await result
        for replica in replicas:
            replica.process.stop(timeout=30)
        redis.stop(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--kill-every", type=float, default=20)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--max-migrations", type=int, default=2)
    parser.add_argument("--hold-seconds", type=float, default=30)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/migration.json"))
    args = parser.parse_args()
    # The migrations themselves are logged at info and warning; picks (debug) are not.
    configure_logging("migration-bench", "info", "console")
    with tempfile.TemporaryDirectory(prefix="migration-bench-") as state:
        result = asyncio.run(measure(args, Path(state)))
    options = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in vars(args).items())
    section = {
        "command": f"python -m benchmarks.migration_bench {options}",
        "machine": machine(),
        **result,
    }
    update_results(args.output, f"max_migrations_{args.max_migrations}", section)
    print(json.dumps({k: v for k, v in section.items() if k != "machine"}, indent=2))


if __name__ == "__main__":
    main()
