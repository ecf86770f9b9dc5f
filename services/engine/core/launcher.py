"""Start the engine-core process and stop it (process.py says what it runs)."""

import asyncio
import os
import sys
from dataclasses import dataclass

from services.common.logging import get_logger
from services.engine.settings import EngineSettings

log = get_logger(__name__)


def core_environment() -> dict[str, str]:
    """This process's environment, with OpenMP's idle threads sleeping unless told otherwise.

    The core computes on every core, so whatever else runs (the serving
    process streaming tokens, a neighbour) preempts one of its threads; with
    OpenMP's default spin-waiting the others then spin at every barrier. On
    the 2-core AMD EPYC (avx2) under load, one stream of the float32 SmolLM2
    ran at 1.9 tokens/s on two threads spinning, 8.6 with PASSIVE, 8.1 on one thread.
    """
    return {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}


@dataclass
class CoreProcess:
    process: asyncio.subprocess.Process

    @classmethod
    async def start(cls, settings: EngineSettings, directory: str) -> "CoreProcess":
        # Spawned from the event loop's (main) thread: the parent-death signal
        # fires when the thread that forked exits, and this one lives as long
        # as the serving process.
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.local.guard",
            str(os.getpid()),
            sys.executable,
            "-m",
            "services.engine.core.process",
            directory,
            settings.model_dump_json(),
            stdin=asyncio.subprocess.DEVNULL,
            env=core_environment(),
        )
        log.info("engine_core_spawned", pid=process.pid)
        return cls(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def wait(self) -> int:
        return await self.process.wait()

    async def stop(self, timeout: float) -> None:
        """After AsyncEngine.stop sent Shutdown: wait for the exit, then kill."""
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            log.warning("engine_core_killed", pid=self.pid)
            self.process.kill()
            await self.process.wait()
