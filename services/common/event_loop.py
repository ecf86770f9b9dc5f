"""Every service's event loop: uvloop's.

A service's process runs one event loop, and its per-message work is mostly
the loop's own: a task woken per streamed token, a write per frame, a wakeup
per gRPC completion. uvloop (libuv, the loop that uvicorn[standard] picks
when installed) does that work in C where asyncio's default loop does it in
Python. Measured on the gateway, 32 paced streams, alternating rounds on one
stack: 0.058 -> 0.054 CPU-ms per streamed token (docs/gateway.md, "The event
loop and the frames' path"). grpc.aio runs on any asyncio loop (its
completion queue is polled by its own thread, which wakes the loop with
call_soon_threadsafe)."""

from collections.abc import Coroutine
from typing import Any

import uvloop


def run(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run on a uvloop loop."""
    uvloop.run(main)
