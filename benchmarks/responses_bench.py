"""What /v1/responses' worst inputs cost, and what one tenant's store flood costs another.

1. The largest input the body limit allows: 2,048 message items (the cap)
   filling a 4 MiB body, validated (responses/request.py) and translated to
   the chat request (responses/translate.py): CPU seconds and peak Python
   memory (tracemalloc), as the route pays them before the tokenizer.
2. A stored-bytes flood: `--writers` concurrent writers of one tenant store
   ~`--row-kib` KiB responses past its byte bound (every write then evicts),
   while another tenant reads and writes its own; the victim's read and write
   latency alone and under the flood, and the flooder's rows and bytes after
   (its bound must hold). SQLite, as `maas up` runs it (one writer at a time:
   the victim's writes queue behind the flooder's, which is what is measured).

    nice .venv/bin/python -m benchmarks.responses_bench --output benchmarks/results/responses.json
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from benchmarks.machine import machine
from maas_services.common.openai_api.schemas import MAX_MESSAGES
from maas_services.gateway.responses.request import ResponsesRequest
from maas_services.gateway.responses.store import ResponseStore, StoreLimits
from maas_services.gateway.responses.translate import translate

BODY_LIMIT = 4 * 1024 * 1024


def largest_body() -> bytes:
    overhead = len(json.dumps({"role": "user", "content": ""})) + 2
    text = "word " * ((BODY_LIMIT // MAX_MESSAGES - overhead - 64) // 5)
    items = [{"role": "user", "content": text} for _ in range(MAX_MESSAGES)]
    body = json.dumps({"model": "m", "input": items}).encode()
    assert len(body) <= BODY_LIMIT, len(body)
    return body


def parse_cost(rounds: int) -> dict:
    body = largest_body()
    cpu = []
    for _ in range(rounds):
        started = time.process_time()
        request = ResponsesRequest.model_validate_json(body)
        translate(request, "resp_bench", None, None)
        cpu.append(time.process_time() - started)
    tracemalloc.start()
    request = ResponsesRequest.model_validate_json(body)
    translate(request, "resp_bench", None, None)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "body_bytes": len(body),
        "items": MAX_MESSAGES,
        "cpu_seconds_p50": round(statistics.median(cpu), 4),
        "cpu_seconds_max": round(max(cpu), 4),
        "peak_python_mb": round(peak / 2**20, 1),
    }


def quantiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 2),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
    }


async def victim(store: ResponseStore, rounds: int) -> tuple[list[float], list[float]]:
    reads, writes = [], []
    for i in range(rounds):
        started = time.perf_counter()
        await store.put("victim", f"victim_{i}_{time.time_ns()}", {"i": i}, [])
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert await store.get("victim", "victim_kept") is not None
        reads.append(time.perf_counter() - started)
    return reads, writes


async def flood(store: ResponseStore, writers: int, row_kib: int, stop: asyncio.Event) -> int:
    pad = "f" * (row_kib * 1024)
    written = 0

    async def writer(index: int) -> None:
        nonlocal written
        while not stop.is_set():
            await store.put("flood", f"flood_{index}_{time.time_ns()}", {"pad": pad}, [])
            written += 1

    await asyncio.gather(*(writer(i) for i in range(writers)))
    return written


async def flood_cost(args) -> dict:
    limits = StoreLimits(max_bytes_per_tenant=args.bound_mib * 2**20)
    with tempfile.TemporaryDirectory() as folder:
        store = await ResponseStore.open(f"sqlite+aiosqlite:///{folder}/bench.db", limits)
        try:
            await store.put("victim", "victim_kept", {"kept": True}, [])
            alone_reads, alone_writes = await victim(store, args.victim_rounds)
            # Fill the flooder to its bound first: every flood write then evicts.
            stop = asyncio.Event()
            flooding = asyncio.create_task(flood(store, args.writers, args.row_kib, stop))
            while (await store.usage("flood"))[1] < limits.max_bytes_per_tenant * 0.9:
                await asyncio.sleep(0.2)
            reads, writes = await victim(store, args.victim_rounds)
            stop.set()
            written = await flooding
            rows, size = await store.usage("flood")
        finally:
            await store.close()
    return {
        "bound_bytes": limits.max_bytes_per_tenant,
        "writers": args.writers,
        "row_kib": args.row_kib,
        "flood_rows_written": written,
        "flood_rows_after": rows,
        "flood_bytes_after": size,
        "bound_held": size <= limits.max_bytes_per_tenant,
        "victim_read_alone": quantiles(alone_reads),
        "victim_read_under_flood": quantiles(reads),
        "victim_write_alone": quantiles(alone_writes),
        "victim_write_under_flood": quantiles(writes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parse-rounds", type=int, default=5)
    parser.add_argument("--victim-rounds", type=int, default=200)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--row-kib", type=int, default=64)
    parser.add_argument("--bound-mib", type=int, default=64)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    result = {
        "machine": machine(),
        "largest_input": parse_cost(args.parse_rounds),
        "store_flood": asyncio.run(flood_cost(args)),
    }
    print(json.dumps(result, indent=2))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
