"""Stop work for a client that has gone away, with no task waiting for it to go.

The gateway's HTTP protocol (http_protocol.py) puts its connection's
ClientWatch in each request's scope. Work done for the client runs inside
`cancelled_if_gone(scope)`; when the connection is lost, the watch cancels
the task in that block wherever it waits (the engine's first token, a
stalled engine's next token, a send), and the block turns that cancellation
into ClientGoneError. The work's own cleanup runs as for any cancellation:
the engine request is aborted or cancelled, its slot freed, its tokens
settled (run.py, engine_client.py).

What this replaces cost tasks on every request: Starlette streams a response
under ASGI spec < 2.4 (uvicorn's) from a task of its own beside one waiting
for http.disconnect, and the wait for the first token raced the work, in a
task, against another task waiting for http.disconnect.

Under a server without the watch (an in-process test transport) the block
cancels nothing.
"""

import asyncio

from starlette.types import Scope

WATCH = "maas.client_watch"


class ClientGoneError(Exception):
    pass


class ClientWatch:
    """One connection's: `lost` cancels the task in a `cancelled_if_gone` block."""

    __slots__ = ("gone", "task")

    def __init__(self):
        self.gone = False
        self.task: asyncio.Task | None = None

    def lost(self) -> None:
        self.gone = True
        if self.task is not None:
            self.task.cancel()


class cancelled_if_gone:
    """Raises ClientGoneError from the block if the client is gone, at its
    start or while it runs; other exceptions and cancellations pass."""

    __slots__ = ("_watch", "_task", "_cancelling")

    def __init__(self, scope: Scope):
        self._watch: ClientWatch | None = scope.get("extensions", {}).get(WATCH)

    def __enter__(self) -> None:
        watch = self._watch
        if watch is None:
            return
        if watch.gone:
            raise ClientGoneError()
        self._task = asyncio.current_task()
        # A cancellation already asked of the task is not the watch's.
        self._cancelling = self._task.cancelling()
        watch.task = self._task

    def __exit__(self, exc_type, exc, traceback) -> None:
        watch = self._watch
        if watch is None:
            return
        watch.task = None
        # If gone, the watch cancelled this task (undone here, always); as in
        # asyncio.timeout, only a cancellation no one else asked for becomes
        # the client's leaving.
        if (
            watch.gone
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise ClientGoneError() from exc
