"""A service whose shutdown hangs still ends: under `maas up` a child whose parent was
killed gets SIGTERM from the kernel and no SIGKILL after it (grpc_server's
arm_shutdown_watchdog)."""

import signal
import subprocess
import sys
import textwrap

import pytest

# A real gRPC server stopped by run_until_signalled, with a 0.2 s grace and a 1 s
# overrun; HANG says whether its cleanup (on_stop) never returns.
SERVICE = textwrap.dedent(
    """
    import asyncio, sys
    from types import SimpleNamespace
    from maas_services.common import grpc_server

    grpc_server.SHUTDOWN_OVERRUN_SECONDS = 1
    HANG = sys.argv[1] == "hang"

    async def cleanup():
        if HANG:
            await asyncio.Event().wait()

    async def main():
        settings = SimpleNamespace(host="127.0.0.1", port=0, metrics_port=0)
        handle = await grpc_server.start_server("t", settings, [], internal=False)
        # Once run_until_signalled has installed its signal handlers.
        asyncio.get_running_loop().call_soon(lambda: print("ready", flush=True))
        await grpc_server.run_until_signalled(handle, 0.2, on_stop=cleanup)

    asyncio.run(main())
    """
)


def stopped(mode: str) -> int:
    """The service's exit status after a SIGTERM."""
    process = subprocess.Popen(
        [sys.executable, "-c", SERVICE, mode], stdout=subprocess.PIPE, text=True
    )
    try:
        # Its log lines come first, on the same stream.
        assert "ready" in iter(lambda: process.stdout.readline().strip(), "")
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=30)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(("mode", "status"), [("hang", -signal.SIGALRM), ("clean", 0)])
def test_a_shutdown_ends_within_its_grace_and_overrun_however_cleanup_goes(mode, status):
    assert stopped(mode) == status
