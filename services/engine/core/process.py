"""The engine-core process: `python -m maas_services.engine.core.process DIR SETTINGS_JSON`.

Started by the serving process (launcher.py) through maas_tools.local.guard,
so the kernel kills it when the serving process dies: no orphan core
holding the model's memory. It loads the model, computes with every core it
may run on (build.py picks the threads; wide steps use them all, narrow ones
one fewer: compute_threads.py), loads the adapters of --lora-modules (pinned: never
unloaded for room), and runs EngineCore until told to shut down. A --lora-modules
adapter that cannot be loaded ends the core before it is ready, its reason logged
(engine_lora_module_failed): the serving process then exits too.
SIGINT is ignored: a terminal's Ctrl-C reaches the whole process group, and
the serving process stops the core itself, after its in-flight requests have
finished.
"""

import signal
import sys

from maas_services.common.logging import configure_logging, get_logger
from maas_services.engine import metrics
from maas_services.engine.core.adapter_limits import check_adapter_name
from maas_services.engine.core.addresses import CoreAddresses
from maas_services.engine.core.build import build_engine
from maas_services.engine.core.compute_threads import ComputeThreads
from maas_services.engine.core.engine_core import EngineCore
from maas_services.engine.known_answer_check import check_native
from maas_services.engine.llm_engine import LLMEngine
from maas_services.engine.lora.errors import AdapterError
from maas_services.engine.settings import EngineSettings

log = get_logger(__name__)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    directory, settings_json = sys.argv[1], sys.argv[2]
    settings = EngineSettings.model_validate_json(settings_json)
    configure_logging("engine-core", settings.log_level, settings.log_format)
    addresses = CoreAddresses.under(directory)
    engine = build_engine(settings)
    load_lora_modules(engine, settings.lora_module_sources)
    # Before Ready: a model this machine computes wrongly must never serve.
    known_answer_failure = check_native(engine, settings)
    log.info("engine_core_started")
    threads = ComputeThreads(settings.torch_threads, settings.compute_wide_rows)
    EngineCore(engine, addresses.inputs, addresses.outputs, threads, known_answer_failure).run()
    log.info("engine_core_stopped")


def load_lora_modules(engine: LLMEngine, modules: dict[str, str]) -> None:
    """--lora-modules (name -> folder), pinned; SystemExit(1) at the first that fails."""
    for name, source in modules.items():
        try:
            check_adapter_name(name)
            engine.load_adapter(name, source, pinned=True)
        except AdapterError as exc:
            log.error("engine_lora_module_failed", adapter=name, source=source, error=str(exc))
            raise SystemExit(1) from exc
        metrics.LORA_ADAPTER_LOADS.labels("loaded").inc()


if __name__ == "__main__":
    main()
