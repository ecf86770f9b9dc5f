"""Issue 31's body flood: gateway memory and a victim's latency while one key uploads large bodies.

`python -m benchmarks.body_flood_bench` (JSON to benchmarks/results/body_flood.json).
The stack is gateway_bench's (real Redis, tokenizer, router and gateway
processes, stub engines; the gateway pinned to a core of its own). One key
with max_concurrency 2 opens `--connections` connections at once, each
uploading one chat request padded to `--body-mib` MiB with an unknown field;
another tenant sends small chat requests one after another, alone and then
during the flood. Reported: the gateway's RSS before, peak (VmHWM, reset
before the flood) and after (once the flood is answered and `--settle`
seconds have passed), the flood's statuses and slowest answer, and the
victim's latency percentiles both ways. The issue's target: peak growth
under 300 MB; before the byte budget the same flood took the gateway from
117 MB to 2,000 MB, and it stayed at 1,988 MB.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx

from benchmarks.gateway_bench import Processes, ms, pct, start_stack, tenant_key
from benchmarks.machine import cpu_model, load_average_1m

MiB = 1024 * 1024
CHAT = {"model": "stub-fast", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = round(int(value.split()[0]) / 1024, 1)
    return fields


def padded_request(url: str, key: str, size: int) -> bytes:
    padding = "x" * (size - len(json.dumps({**CHAT, "padding": ""})))
    body = json.dumps({**CHAT, "padding": padding}).encode()
    host = url.split("//")[1]
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def upload(url: str, request: bytes) -> tuple[int, float]:
    """One flood connection: (status or 0 if the connection broke, seconds to the answer)."""
    host, port = url.split("//")[1].split(":")
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return 0, time.perf_counter() - started
    writer.write(request)
    # Read while sending: a refusal can come before the body is through.
    sending = asyncio.ensure_future(writer.drain())
    try:
        status = int((await reader.readline()).split()[1])
    except (OSError, IndexError, ValueError):
        status = 0
    answered = time.perf_counter() - started
    sending.cancel()
    writer.close()
    return status, answered


def flood_process(url: str, request: bytes, connections: int) -> list[tuple[int, float]]:
    async def flood():
        return await asyncio.gather(*(upload(url, request) for _ in range(connections)))

    return asyncio.run(flood())


async def victim(url: str, key: str, until) -> list[float]:
    seconds = []
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        while not until():
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=CHAT)
            response.raise_for_status()
            seconds.append(time.perf_counter() - started)
    return seconds


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as state:
        procs = Processes(Path(state))
        try:
            stack = await start_stack(procs, 4)
            pid = stack["gateway_pid"]
            attacker = await tenant_key(stack["redis_url"], "flooder", max_concurrency=2)
            victim_key = await tenant_key(stack["redis_url"], "victim")
            warm = await victim(stack["url"], victim_key, iter([False] * 20 + [True]).__next__)
            alone = await victim(
                stack["url"], victim_key, iter([False] * args.victim_runs + [True]).__next__
            )
            before = memory_mb(pid)
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            request = padded_request(stack["url"], attacker, int(args.body_mib * MiB))
            flood_started = time.perf_counter()
            # The flood from a process of its own: 600 MB of uploads would slow
            # this process's loop, and with it the victim's timings.
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                flood = asyncio.get_running_loop().run_in_executor(
                    pool, flood_process, stack["url"], request, args.connections
                )
                under = await victim(stack["url"], victim_key, flood.done)
                answers = await flood
            flood_seconds = time.perf_counter() - flood_started
            peak = memory_mb(pid)
            await asyncio.sleep(args.settle)
            after = memory_mb(pid)
        finally:
            procs.stop()
    statuses: dict[int, int] = {}
    for status, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "benchmark": "body_flood",
        "command": " ".join(["python -m benchmarks.body_flood_bench", *sys.argv[1:]]),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "python": platform.python_version(),
            "load_average_1m": load_average_1m(),
        },
        "flood": {
            "connections": args.connections,
            "body_mib": args.body_mib,
            "attacker_max_concurrency": 2,
            "statuses": statuses,
            "answer_s": {
                str(code): {
                    "p50": round(pct(times, 50), 3),
                    "max": round(max(times), 3),
                }
                for code in statuses
                for times in [[s for status, s in answers if status == code]]
            },
            "seconds": round(flood_seconds, 2),
        },
        "gateway_rss_mb": {
            "before": before["VmRSS"],
            "peak": peak["VmHWM"],
            "after": after["VmRSS"],
            "peak_growth": round(peak["VmHWM"] - before["VmRSS"], 1),
            "settle_seconds": args.settle,
        },
        "victim_latency_ms": {
            "alone_p50": ms(pct(alone, 50)),
            "alone_p99": ms(pct(alone, 99)),
            "under_flood_p50": ms(pct(under, 50)) if under else None,
            "under_flood_p99": ms(pct(under, 99)) if under else None,
            "under_flood_requests": len(under),
            "warm_up_requests": len(warm),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=150)
    parser.add_argument("--body-mib", type=float, default=4.0)
    parser.add_argument("--victim-runs", type=int, default=50)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before 'after'")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/body_flood.json"))
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(json.dumps(results, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
