"""The engine core on a thread of the test process, behind the real sockets and client.

For tests that reach into the LLMEngine they built; in serving the core is
its own process (services/engine/core/process.py), over the same protocol.
"""

import asyncio
import tempfile
import threading
from contextlib import asynccontextmanager

from maas_services.engine.async_engine import AsyncEngine
from maas_services.engine.core.addresses import CoreAddresses
from maas_services.engine.core.compute_threads import ComputeThreads
from maas_services.engine.core.engine_core import EngineCore
from maas_services.engine.llm_engine import LLMEngine


@asynccontextmanager
async def core_on_thread(engine: LLMEngine, threads: ComputeThreads | None = None):
    with tempfile.TemporaryDirectory(prefix="maas-core-") as directory:
        addresses = CoreAddresses.under(directory)
        client = AsyncEngine(addresses)
        core = EngineCore(engine, addresses.inputs, addresses.outputs, threads)
        thread = threading.Thread(target=core.run, name="engine-core", daemon=True)
        thread.start()
        try:
            await client.start()
            yield client
        finally:
            await client.stop()
            await asyncio.to_thread(thread.join, 30)
