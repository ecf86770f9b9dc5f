"""Local mode started for one benchmark run, as `maas up` would, then stopped.

Each run's state and logs stay in STATE_DIR/bench/LABEL (default .maas),
so a surprising result can be traced in the router's and engines' logs.
"""

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from maas_tools.local.ports import free_port
from maas_tools.local.stack import Stack, StackConfig


@contextlib.asynccontextmanager
async def local_stack(
    policy: str, replicas: int, engine_args: list[str], label: str = ""
) -> AsyncIterator[Stack]:
    # One directory per run label (policy, or policy/engine variant).
    name = (label or policy).replace("/", "-")
    state = Path(os.environ.get("MAAS_STATE_DIR", ".maas")) / "bench" / name
    shutil.rmtree(state, ignore_errors=True)  # logs of this run only
    config = StackConfig(
        state_dir=state,
        gateway_port=free_port(),
        engine_replicas=replicas,
        engine_args=engine_args,
        routing_policy=policy,
    )
    stack = Stack(config)
    try:
        await stack.start()
        yield stack
    except BaseException:
        for process in stack.dead():
            print(f"--- {process.name} exited; last log lines:\n{process.log_tail()}")
        raise
    finally:
        stack.stop()
