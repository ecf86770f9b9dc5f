"""`maas top`: a live view of a running stack, or one frame as text (--once).

Local mode needs no flags: `maas up` leaves STATE_DIR/stack.json. For a
cluster, pass the router's gRPC address (and the gateway's and billing's
/metrics URLs); engine replicas are found through the router.
"""

import argparse
import asyncio
import contextlib
import os
import sys
from collections import deque
from pathlib import Path

from rich.console import Console
from rich.live import Live

from maas_services.common.defaults import METRICS_PORT
from maas_tools.top.snapshot import Collector, Snapshot
from maas_tools.top.targets import Targets
from maas_tools.top.view import Frame, render

LATENCY_WINDOW_SECONDS = 60.0
SINCE_START = "each process's lifetime"
# Piped output (a file, a test) would otherwise wrap at 80 columns.
PIPED_WIDTH = 120


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maas top", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("MAAS_STATE_DIR", ".maas"),
        help="the state directory of a local stack (maas up's --state-dir)",
    )
    parser.add_argument(
        "--router-address", default="", help="a cluster's router, host:port (no state file)"
    )
    parser.add_argument("--gateway-metrics", default="", help="the gateway's /metrics URL")
    parser.add_argument("--billing-metrics", default="", help="billing's /metrics URL")
    parser.add_argument(
        "--engine-metrics-port",
        type=int,
        default=METRICS_PORT,
        help="the port engine replicas serve /metrics on, at their router-listed host",
    )
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between frames")
    parser.add_argument("--once", action="store_true", help="print one frame as text and exit")
    return parser.parse_args(argv)


def targets_of(args: argparse.Namespace) -> Targets:
    if args.router_address:
        return Targets(
            args.router_address,
            args.gateway_metrics,
            args.billing_metrics,
            engine_metrics_port=args.engine_metrics_port,
        )
    try:
        return Targets.from_state(Path(args.state_dir))
    except FileNotFoundError:
        raise SystemExit(
            f"maas top: no running stack in {args.state_dir}/ (start one with `maas up`, "
            "or pass --router-address for a cluster)"
        ) from None


async def once(collector: Collector, interval: float, console: Console) -> None:
    """Two snapshots `interval` apart, for rates; latency over each process's lifetime."""
    first = await collector.take()
    await asyncio.sleep(interval)
    console.print(render(Frame(await collector.take(), first, None, SINCE_START)))


async def live(collector: Collector, interval: float, console: Console) -> None:
    history: deque[Snapshot] = deque()
    with Live(console=console, auto_refresh=False) as view:
        while True:
            now = await collector.take()
            history.append(now)
            while now.taken - history[0].taken > LATENCY_WINDOW_SECONDS:
                history.popleft()
            previous = history[-2] if len(history) > 1 else None
            start = history[0] if previous else None
            label = f"the last {now.taken - start.taken:.0f}s" if start else SINCE_START
            view.update(render(Frame(now, previous, start, label)), refresh=True)
            await asyncio.sleep(interval)


async def run(args: argparse.Namespace) -> None:
    console = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
    collector = Collector(targets_of(args))
    try:
        await (once if args.once else live)(collector, args.interval, console)
    finally:
        await collector.close()


def main(argv: list[str]) -> int:
    # Ctrl-C is how a live view ends: not an error.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(parse_args(argv)))
    return 0
