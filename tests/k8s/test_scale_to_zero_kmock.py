"""Scale to zero and back with the real kopf operator against kmock (#17).

Idle for scaleToZeroAfterSeconds drains and removes the last replica; requests
the gateways hold (in the router's pool stats) bring one back at once, and the
cold start is timed and posted.
"""

import pytest

from tests.k8s.test_operator_kmock import (
    create,
    eventually,
    md,
    model_deployment,
    reasons,
    replicas_asked,
    running_cluster,
)

pytestmark = pytest.mark.timeout(120)


def condition(emulator, kind: str) -> dict:
    conditions = (md(emulator).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


async def test_idle_deployment_scales_to_zero_and_a_held_request_starts_a_replica():
    async with running_cluster() as (emulator, client, pool):
        body = model_deployment(replicas={"min": 0, "max": 2})
        body["spec"]["autoscaling"]["scaleToZeroAfterSeconds"] = 1
        await create(client, body)
        # min 0 starts at zero replicas: nothing is asked for until a request waits.
        await eventually(
            lambda: (md(emulator).get("status") or {}).get("scaledToZero") is True,
            what="scaledToZero",
        )
        assert condition(emulator, "Available")["reason"] == "ScaledToZero"
        assert condition(emulator, "Ready")["status"] == "True"

        pool.hold_starting = True
        pool.held = 2
        await eventually(lambda: replicas_asked(emulator) == 1, what="a replica from zero")
        await eventually(lambda: "ColdStart" in reasons(emulator), what="ColdStart event")
        assert "RequestsHeld" in reasons(emulator)
        # A tick's events are posted as it runs, its status patched when it returns: the
        # status is read once it has landed.
        await eventually(
            lambda: md(emulator)["status"].get("heldRequests") == 2, what="heldRequests status"
        )
        assert md(emulator)["status"]["scaledToZero"] is False

        pool.hold_starting = False  # weights loaded: the replica is ready
        await eventually(lambda: "ColdStarted" in reasons(emulator), what="ColdStarted")
        await eventually(
            lambda: md(emulator)["status"].get("coldStartSeconds", 0) > 0,
            what="coldStartSeconds status",
        )

        pool.held = 0  # served; idle again for a second: back to zero
        await eventually(lambda: replicas_asked(emulator) == 0, what="scale to zero")
        await eventually(lambda: len(pool.removed) == 1, what="the last pod removed")
        assert "DrainStarted" in reasons(emulator)
