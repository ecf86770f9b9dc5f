"""A second gateway running another source tree beside a bench stack's services,
for an A/B from one run (gateway_ab, gateway_stream_ab, gateway_latency).

The tree (a git revision exported, or a folder copied before a change) is
imported under the installed names (maas_services, maas_tools, ...) through
links in a directory put first on PYTHONPATH, so the editable install's own
mapping to this checkout never serves the old side. It is pinned to core 0,
beside the stack's own gateway (gateway_bench.start_stack), so both pay for
the same CPU.
"""

import os
import subprocess
from pathlib import Path

from benchmarks.gateway_bench import Processes, pin
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready

# Import name -> folder of the tree (pyproject's package-dir).
PACKAGES = {
    "maas": "proto/maas",
    "maas_services": "services",
    "maas_tools": "tools",
    "maas_operator": "operators",
    "maas_kernels": "kernels",
}


def export(revision: str, state: Path) -> Path:
    """The revision's tree, in `state`/base."""
    into = state / "base"
    into.mkdir()
    archive = subprocess.run(["git", "archive", revision], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def import_path(tree: Path, state: Path) -> Path:
    """A directory in `state` whose entries import the tree under the installed names."""
    links = state / "imports"
    links.mkdir()
    for name, folder in PACKAGES.items():
        (links / name).symlink_to(tree.resolve() / folder)
    return links


async def start_base_gateway(procs: Processes, stack: dict, tree: Path) -> tuple[str, int]:
    """(url, pid) of a gateway running `tree` against the stack's services."""
    url = f"http://127.0.0.1:{free_port()}"
    argv = serve_argv(
        "gateway",
        {
            "port": url.rsplit(":", 1)[1],
            "redis-url": stack["redis_url"],
            "tokenizer-address": stack["tokenizer"],
            "router-address": stack["router"],
            "routes-file": procs.state / "routes.yaml",
            # Its own spool: two gateways on one would wait for each other's lock.
            "usage-spool-dir": procs.state / "spool-base",
            "log-level": "warning",
        },
    )
    process = ManagedProcess(
        "gateway-base",
        argv,
        procs.state / "logs" / "gateway-base.log",
        env={"PYTHONPATH": str(import_path(tree, procs.state))},
    )
    process.start()
    procs.running.append(process)
    await wait_ready(process, f"{url}/readyz", 180)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        pin(process.pid, {0})
    return url, process.pid
