"""Issue #33's scoreboard: `maas conformance` against maas and the servers users
would run instead, here, one at a time: `python -m benchmarks.conformance_scoreboard`.

- maas: local mode as `maas up` starts it; the disconnect check reads engine-0's
  `maas_engine_requests_running`; the rate-limit probe uses a tenant made for it
  with 3 requests a minute.
- vLLM's OpenAI server (its CPU build, the peers venv), float32, eager, with
  the hermes tool-call parser (without one it refuses named tool choices); its
  /metrics has `vllm:num_requests_running`; it limits nothing.
- llama.cpp's server (llama-cpp-python's, the peers venv), on the GGUF file.

Each server is started, probed with the same flags, and stopped before the
next. Writes benchmarks/results/conformance_<server>.json (the suite's own
JSON plus the command and the machine) and conformance.md (the table).
"""

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.machine import machine
from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.conformance.main import main as conformance

SERVERS = ("maas", "vllm", "llamacpp")
PROBE = 16  # requests in the rate-limit burst


@dataclass
class Endpoint:
    base_url: str
    key: str = ""
    metrics_url: str = ""
    rate_limit_key: str = ""


@contextlib.asynccontextmanager
async def maas() -> AsyncIterator[Endpoint]:
    from maas_services.common.redis_client import open_redis
    from maas_services.gateway.admission.tenants import TenantStore
    from maas_tools.bench.local_stack import local_stack

    async with local_stack("prefix_affinity", 1, [], "conformance") as stack:
        redis = open_redis(stack.redis_url)
        try:
            store = TenantStore(redis)
            name = f"conformance-{uuid.uuid4().hex[:8]}"
            await store.create_tenant(name, rpm=3)
            limited = (await store.create_key(name))[1]
        finally:
            await redis.aclose()
        yield Endpoint(
            f"{stack.gateway_url}/v1", stack.api_key, stack.metrics_urls["engine-0"], limited
        )


@contextlib.asynccontextmanager
async def vllm(log_dir: Path) -> AsyncIterator[Endpoint]:
    from maas_tools.peers.model_folder import hf_model_folder
    from maas_tools.peers.venv import VLLM, ensure
    from maas_tools.peers.vllm_server import VllmConfig, VllmServer

    config = VllmConfig(
        python=ensure(VLLM),
        model=hf_model_folder(None),
        served_model_name=DEFAULT_MODEL_ID,
        dtype="float32",
        enforce_eager=True,
        # Without a parser vLLM refuses every tool_choice naming a function (400).
        extra_args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    )
    server = VllmServer(config, log_dir / "vllm.log")
    await asyncio.to_thread(server.start)
    try:
        yield Endpoint(f"{server.url}/v1", metrics_url=f"{server.url}/metrics")
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def llamacpp(log_dir: Path) -> AsyncIterator[Endpoint]:
    from maas_tools.peers.llamacpp_server import LlamaCppConfig, llamacpp_server

    async with llamacpp_server(LlamaCppConfig(log_path=log_dir / "llama.log")) as base_url:
        yield Endpoint(base_url, metrics_url=base_url.removesuffix("/v1") + "/metrics")


def suite_argv(endpoint: Endpoint, output: Path) -> list[str]:
    argv = [endpoint.base_url, "--model", DEFAULT_MODEL_ID, "--rate-limit-probe", str(PROBE)]
    if endpoint.key:
        argv += ["--key", endpoint.key]
    if endpoint.rate_limit_key:
        argv += ["--rate-limit-key", endpoint.rate_limit_key]
    if endpoint.metrics_url:
        argv += ["--metrics-url", endpoint.metrics_url]
    return argv + ["--format", "json", "--output", str(output)]


async def score(name: str, out_dir: Path, log_dir: Path) -> dict:
    opened = {"maas": maas, "vllm": lambda: vllm(log_dir), "llamacpp": lambda: llamacpp(log_dir)}
    output = out_dir / f"conformance_{name}.json"
    async with opened[name]() as endpoint:
        argv = suite_argv(endpoint, output)
        code = await asyncio.to_thread(conformance, argv)
    report = json.loads(output.read_text())
    shown = [a if a not in (endpoint.key, endpoint.rate_limit_key) else "KEY" for a in argv]
    report.update(server=name, exit_code=code, command="maas conformance " + shlex.join(shown))
    report["machine"] = machine()
    output.write_text(json.dumps(report, indent=2) + "\n")
    return report


MARK = {"pass": "pass", "fail": "**FAIL**", "not offered": "not offered"}


def markdown(reports: list[dict]) -> str:
    ids = [c["id"] for c in reports[0]["checks"]]
    by_server = [{c["id"]: c for c in r["checks"]} for r in reports]
    lines = [
        "| check | " + " | ".join(r["server"] for r in reports) + " |",
        "|---" * (len(reports) + 1) + "|",
    ]
    for check_id in ids:
        cells = [MARK[s[check_id]["outcome"]] if check_id in s else "" for s in by_server]
        lines.append(f"| {check_id} | " + " | ".join(cells) + " |")
    lines.append("| **exit code** | " + " | ".join(str(r["exit_code"]) for r in reports) + " |")
    for r in reports:
        lines += ["", f"**{r['server']}** (`{r['command']}`):", ""]
        for c in r["checks"]:
            if c["outcome"] != "pass":
                lines.append(f"- {c['id']}: {c['outcome']}: {' '.join(c['detail'].split())}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--log-dir", type=Path, default=Path(".maas/bench/conformance-peers"))
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    reports = []
    for name in args.servers.split(","):
        reports.append(asyncio.run(score(name, args.output_dir, args.log_dir)))
        print(f"{name}: {reports[-1]['summary']}", file=sys.stderr)
    print(markdown(reports))
    return 1 if any(r["exit_code"] for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
