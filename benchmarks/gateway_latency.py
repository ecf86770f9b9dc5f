"""What the gateway adds to a one-token request, stage by stage (issue 38 item 3).

The bench's stack (gateway_bench.start_stack: real Redis, tokenizer, router and
gateway processes, a stub engine that answers at once, the gateway pinned to a
core of its own) with tracing on: the services export their spans over OTLP
to a collector in this process. Their sampler follows the caller
(parentbased, ratio 0), so only requests sent with a sampled `traceparent`
are traced; the others cost what they cost in production, untraced.

One-token chat streams, interleaved: untraced through the gateway (the client's
latency), straight to the stub engine's Generate (the engine's own latency,
what the gateway's is compared with), and traced (the stage table), from two
tenants with limits (TENANTS): RPM, TPM and concurrency, pay as you go or
prepaid (its balance is held too), and RPM and concurrency only. With
`--baseline DIR`, a second gateway runs the source tree in DIR (a checkout or
a copy taken before a change: base_gateway.py), on the same core, beside the
same tokenizer, router and engine, and every round sends to both in turn: an
A/B from one run.

Stages, p50 / p99 / mean over the traced requests, from the gateway's spans:
the HTTP span (the request's arrival to its response's end), its admission
steps (pipeline.py: limits, route, reserve, queue), the tokenizer and router
calls (the gateway's CLIENT span and the service's own SERVER span: the
difference is the hop), the engine's Generate (to the stream's end), and what
no span covers (the HTTP span less its steps: parsing, auth, the Run's
tasks, SSE). `make bench-gateway-latency`; JSON into
benchmarks/results/gateway_latency.json.
"""

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from benchmarks.base_gateway import start_base_gateway
from benchmarks.gateway_bench import (
    MESSAGES,
    Processes,
    added,
    cpu_seconds,
    direct,
    ms,
    pct,
    start_stack,
    tenant_key,
)
from benchmarks.machine import machine
from benchmarks.results_file import report
from maas_services.common.billing_keys import balance_key
from maas_services.common.redis_client import open_redis
from maas_tools.local.ports import free_port

HTTP_SPAN = "POST /v1/chat/completions"
# The tenants the requests come from: name -> its limits, and whether it is prepaid.
TENANTS = {
    "pay_as_you_go": ({"rpm": 10**9, "tpm": 10**12, "max_concurrency": 10**4}, False),
    "prepaid": ({"rpm": 10**9, "tpm": 10**12, "max_concurrency": 10**4}, True),
    "no_tpm": ({"rpm": 10**9, "max_concurrency": 10**4}, False),
}
# Span name -> stage, in the order of a request's path. CLIENT and SERVER spans
# of one call share a name: the service tells them apart.
STAGES = [
    ("maas-gateway", HTTP_SPAN, "gateway HTTP span"),
    ("maas-gateway", "gateway.limits", "limits (RPM/concurrency, quota)"),
    ("maas-gateway", "gateway.route", "route"),
    ("maas-gateway", "maas.v1.Tokenizer/RenderChat", "tokenize (gateway's call)"),
    ("maas-tokenizer", "maas.v1.Tokenizer/RenderChat", "tokenize (tokenizer's own)"),
    ("maas-gateway", "maas.v1.Tokenizer/ValidateGrammar", "grammar check"),
    ("maas-gateway", "gateway.reserve", "reserve (TPM, balance)"),
    ("maas-gateway", "gateway.queue", "fair queue"),
    ("maas-gateway", "maas.v1.Router/Pick", "pick (gateway's call)"),
    ("maas-router", "maas.v1.Router/Pick", "pick (router's own)"),
    ("maas-gateway", "maas.v1.Engine/Generate", "engine Generate (to its end)"),
]
# The gateway's own steps: the HTTP span less these is what no span covers.
GATEWAY_STEPS = {"gateway.limits", "gateway.route", "gateway.reserve", "gateway.queue"} | {
    "maas.v1.Tokenizer/RenderChat",
    "maas.v1.Tokenizer/ValidateGrammar",
    "maas.v1.Router/Pick",
    "maas.v1.Engine/Generate",
}


class SpanCollector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: (trace id, service, span name) -> durations in seconds."""

    def __init__(self):
        self.spans: dict[tuple[bytes, str, str], list[float]] = defaultdict(list)

    async def Export(self, request, context):
        for resource_spans in request.resource_spans:
            attributes = resource_spans.resource.attributes
            service = next(a.value.string_value for a in attributes if a.key == "service.name")
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    seconds = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
                    self.spans[(span.trace_id, service, span.name)].append(seconds)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def start(self) -> tuple[grpc.aio.Server, str]:
        server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, server)
        address = f"127.0.0.1:{free_port()}"
        server.add_insecure_port(address)
        await server.start()
        return server, address


def traced_headers(key: str) -> tuple[bytes, dict[str, str]]:
    """A new sampled trace's id and the headers that start it at the gateway."""
    trace_id = secrets.token_bytes(16)
    parent = f"00-{trace_id.hex()}-{secrets.token_hex(8)}-01"
    return trace_id, {"Authorization": f"Bearer {key}", "traceparent": parent}


async def one_token(client: httpx.AsyncClient, headers: dict[str, str]) -> tuple[float, float]:
    """(first token, end) seconds of one streamed one-token chat request."""
    body = {"model": "stub-fast", "messages": MESSAGES, "max_tokens": 1, "stream": True}
    started, first = time.perf_counter(), None
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {") and '"content":' in line:
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - started, end - started


def stage_table(collector: SpanCollector, traced: dict[bytes, float]) -> dict:
    """p50/p99/mean ms of each stage over the traced requests (trace id -> the
    client's latency)."""
    trace_ids = list(traced)
    table = {"client latency (traced)": summary(list(traced.values()))}
    for service, name, stage in STAGES:
        found = (collector.spans.get((t, service, name)) for t in trace_ids)
        values = [sum(spans) for spans in found if spans]
        if values:
            table[stage] = summary(values)
    uncovered, outside = [], []
    for t in trace_ids:
        http = collector.spans.get((t, "maas-gateway", HTTP_SPAN))
        if http:
            steps = sum(sum(collector.spans.get((t, "maas-gateway", n), ())) for n in GATEWAY_STEPS)
            uncovered.append(http[0] - steps)
            outside.append(traced[t] - http[0])
    if uncovered:
        table["gateway, no span (parse, auth, Run tasks, SSE)"] = summary(uncovered)
        table["outside the HTTP span (client, loopback, uvicorn)"] = summary(outside)
    return table


def summary(values: list[float]) -> dict:
    return {
        "p50_ms": ms(pct(values, 50)),
        "p99_ms": ms(pct(values, 99)),
        "mean_ms": ms(statistics.fmean(values)),
        "n": len(values),
    }


async def measure(args) -> dict:
    collector = SpanCollector()
    server, address = await collector.start()
    os.environ.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{address}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0",
        OTEL_BSP_SCHEDULE_DELAY="200",
    )
    try:
        with tempfile.TemporaryDirectory() as state:
            procs = Processes(Path(state))
            try:
                stack = await start_stack(procs, 1)
                gateways = {args.label: (stack["url"], stack["gateway_pid"])}
                if args.baseline:
                    gateways["baseline"] = await start_base_gateway(procs, stack, args.baseline)
                keys = {kind: await tenant(stack["redis_url"], kind) for kind in TENANTS}
                return await rounds(args, stack, gateways, keys, collector)
            finally:
                procs.stop()
    finally:
        await server.stop(None)


async def tenant(redis_url: str, kind: str) -> str:
    """A key of a TENANTS tenant: with limits (the limiter's scripts run), and
    prepaid or not (a prepaid tenant's balance is held too)."""
    limits, prepaid = TENANTS[kind]
    key = await tenant_key(redis_url, kind, **limits)
    if prepaid:
        redis = open_redis(redis_url)
        try:
            await redis.set(balance_key(kind), 10**18)
        finally:
            await redis.aclose()
    return key


async def rounds(args, stack: dict, gateways: dict, keys: dict, collector) -> dict:
    clients = {name: httpx.AsyncClient(base_url=url) for name, (url, _) in gateways.items()}
    # (gateway, tenant) -> first token, total, {traced id: total}, CPU per request
    seen = {(g, t): ([], [], {}, []) for g in gateways for t in keys}
    directs: tuple[list, list] = ([], [])
    try:
        for name, kind in seen:  # warm up
            for _ in range(20):
                await one_token(clients[name], {"Authorization": f"Bearer {keys[kind]}"})
                await one_token(clients[name], traced_headers(keys[kind])[1])
        await direct(stack, 20, 1)
        for _ in range(args.runs // args.block):
            d_first, d_total = await direct(stack, args.block, 1)
            directs[0].extend(d_first)
            directs[1].extend(d_total)
            for (name, kind), (first, total, traced, cpu) in seen.items():
                client, key = clients[name], keys[kind]
                plain = {"Authorization": f"Bearer {key}"}
                pid = gateways[name][1]
                before = cpu_seconds(pid)
                for _ in range(args.block):
                    f, t = await one_token(client, plain)
                    first.append(f)
                    total.append(t)
                cpu.append((cpu_seconds(pid) - before) / args.block)
                for _ in range(args.block // 2):
                    trace_id, headers = traced_headers(key)
                    traced[trace_id] = (await one_token(client, headers))[1]
        await asyncio.sleep(1.0)  # the last spans' export
    finally:
        for client in clients.values():
            await client.aclose()
    results = defaultdict(dict)
    for (name, kind), (first, total, traced, cpu) in seen.items():
        results[name][kind] = {
            "added_ms": added((first, total), directs),
            "gateway_cpu_ms_each": ms(statistics.fmean(cpu)),
            "runs": len(total),
            "stages_ms": stage_table(collector, traced),
        }
    return results


async def run(args) -> dict:
    return {
        "machine": machine(),
        "label": args.label,
        "request": "chat, one message, max_tokens 1, stream; a tenant with RPM/TPM/concurrency",
        **await measure(args),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="untraced requests per gateway")
    parser.add_argument("--block", type=int, default=20, help="requests per gateway in turn")
    parser.add_argument("--baseline", type=Path, help="a source tree to A/B against")
    parser.add_argument("--label", default="working_tree", help="what was measured")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    report(asyncio.run(run(args)), args.output)


if __name__ == "__main__":
    main()
