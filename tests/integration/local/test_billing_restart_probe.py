"""A restarted billing counts as started once its loop is alive (the gRPC health
name 'liveness'), not once it is ready: while Redis is down billing is alive but
unready, and waiting for readiness would call a Redis outage a crash loop and
end the whole stack."""

import asyncio
import os
import signal

from structlog.testing import capture_logs

from maas_services.billing.health import LIVENESS_SERVICE
from maas_services.common.service_token import ENV as SERVICE_TOKEN_ENV
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import _grpc_serving, wait_ready
from maas_tools.local.supervisor import RestartPolicy, supervise
from tests.integration.router.conftest import eventually

# One failed start ends supervision: a restart that waited for readiness would.
ONE_TRY = RestartPolicy(initial_backoff=0.05, max_start_failures=1)


async def test_billing_restarted_while_redis_is_down_is_started_not_crash_looping(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # no Redis listens there
    argv = serve_argv(
        "billing",
        {
            "port": address.rsplit(":", 1)[1],
            "redis-url": nobody,
            "billing-database-url": f"sqlite:///{tmp_path}/billing.db",
        },
    )
    billing = ManagedProcess(
        "billing",
        argv,
        tmp_path / "billing.log",
        env={SERVICE_TOKEN_ENV: "test-token", "MAAS_METRICS_PORT": str(free_port())},
        probe=address,
        restart_probe=f"{address}/{LIVENESS_SERVICE}",
    )
    billing.start()
    supervising = None
    try:
        await wait_ready(billing, billing.restart_probe, timeout=60)
        assert not await _grpc_serving(address)  # alive, not ready: Redis is down
        with capture_logs() as logs:
            supervising = asyncio.create_task(supervise([billing], ONE_TRY, 60))
            os.kill(billing.pid, signal.SIGKILL)

            def restarted() -> bool:
                assert not supervising.done(), supervising.exception()
                return any(entry["event"] == "child_restarted" for entry in logs)

            await eventually(restarted, timeout=90, what="billing restarted")
        assert billing.restarts == 1 and billing.exited() is None
    finally:
        if supervising is not None:
            supervising.cancel()
            await asyncio.gather(supervising, return_exceptions=True)
        billing.stop(10)
