"""Start the engine-core process and stop it (process.py says what it runs)."""

import asyncio
import os
import sys
from dataclasses import dataclass

from maas_services.common.logging import get_logger
from maas_services.common.machine_profile import MachineProfile, machine_profile
from maas_services.engine.machine_defaults import Resolved, resolve
from maas_services.engine.settings import EngineSettings

log = get_logger(__name__)


def resolve_for_core(settings: EngineSettings) -> Resolved:
    """The core's settings with every `auto` chosen for this machine, logged once.

    Resolved here, not in the core: OpenMP reads its wait policy when the
    core's torch loads, so the environment is decided before the core starts.
    """
    machine = machine_profile()
    on_cuda = _core_on_cuda(settings.device, machine)
    resolved = resolve(settings, machine, on_cuda, os.environ)
    log.info("engine_machine_defaults", **resolved.log_fields(machine))
    return resolved


def _core_on_cuda(device: str, machine: MachineProfile) -> bool:
    """Whether the core will compute on CUDA. Without torch where that cannot be (the
    machine profile sees no NVIDIA GPU): this process computes nothing, and importing
    torch cost every engine start ~2 s of CPU and ~180 MB here."""
    if device == "cpu" or (device == "auto" and not machine.gpu):
        return False
    from maas_services.engine.device import resolve_device

    return resolve_device(device).type == "cuda"


@dataclass
class CoreProcess:
    process: asyncio.subprocess.Process

    @classmethod
    async def start(cls, settings: EngineSettings, directory: str) -> "CoreProcess":
        resolved = resolve_for_core(settings)
        # Spawned from the event loop's (main) thread: the parent-death signal
        # fires when the thread that forked exits, and this one lives as long
        # as the serving process.
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "maas_tools.local.guard",
            str(os.getpid()),
            sys.executable,
            "-m",
            "maas_services.engine.core.process",
            directory,
            resolved.settings.model_dump_json(),
            stdin=asyncio.subprocess.DEVNULL,
            env={**os.environ, **resolved.core_env},
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
