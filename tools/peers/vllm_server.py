"""Starting and stopping one vLLM OpenAI server (the CPU build, or a GPU one).

`vllm_process()` gives the command as a supervised child of `maas up`
(maas_tools.local.processes: logs to a file, dies with its parent, its process
group stopped with it: vLLM's engine core is a process of its own). `VllmServer`
runs one for tests and benchmarks: started, ready on /health, stopped.

Defaults for the CPU build, from issue #14's quirks: the dtype and eager or
compiled as services/common/vllm_cpu_mode.py chooses for this CPU (float32
unless it has native bf16; eager, a start without minutes of compiling,
except bf16 on AMX, which vLLM 0.32 computes wrongly eagerly: issue #32),
`VLLM_CPU_KVCACHE_SPACE` in GiB (unset, it reserves 92% of the machine and
refuses to start beside anything), the OpenMP threads bound to the cores it
is given, and the hub off (no internet here; a local folder needs none).
"""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from maas_services.common.logging import get_logger
from maas_services.common.machine_profile import machine_profile
from maas_services.common.vllm_cpu_mode import vllm_cpu_mode
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess
from maas_tools.local.readiness import wait_ready

log = get_logger(__name__)
ENTRYPOINT = "vllm.entrypoints.openai.api_server"


def cpu_flags() -> frozenset[str]:
    return machine_profile().flags


@dataclass
class VllmConfig:
    python: Path
    # A Hugging Face folder (maas_tools.peers.model_folder.hf_model_folder).
    model: Path
    # The name clients ask for; vLLM answers 404 to any other.
    served_model_name: str = ""
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free one
    # As asked ("auto": per CPU); after init, what vllm_cpu_mode chose for cpu_flags.
    dtype: str = "auto"
    # None: eager where that is right on this CPU (vllm_cpu_mode).
    enforce_eager: bool | None = None
    cpu_flags: frozenset[str] = field(default_factory=cpu_flags)
    mode_reason: str = field(init=False, default="")
    # Whole GiB: vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer.
    kv_cache_gib: int = 1
    # None: no KV events; 0: a free port. ZeroMQ PUB on tcp://host:port, topic "kv-events".
    kv_events_port: int | None = None
    # CPUs its OpenMP threads are bound to, e.g. "0-1" or "1"; "" leaves vLLM's default.
    cpus: str = ""
    max_model_len: int = 0  # 0: the model's own
    # 0: vLLM's default; the adapter in front is told the same (vLLM does not publish it).
    max_num_seqs: int = 0
    extra_args: list[str] = field(default_factory=list)
    # Bearer key its API demands (VLLM_API_KEY, in its environment: never a flag); "" for none.
    api_key: str = ""

    def __post_init__(self) -> None:
        if self.kv_cache_gib != int(self.kv_cache_gib) or self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib must be a whole number of GiB, got {self.kv_cache_gib}")
        self.kv_cache_gib = int(self.kv_cache_gib)
        mode = vllm_cpu_mode(self.cpu_flags, self.dtype, self.enforce_eager)
        self.dtype, self.enforce_eager, self.mode_reason = (
            mode.dtype,
            mode.enforce_eager,
            mode.reason,
        )
        if not self.port:
            self.port = free_port(self.host)
        if self.kv_events_port == 0:
            self.kv_events_port = free_port(self.host)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str:
        """Where a subscriber connects; empty without KV events."""
        return f"tcp://{self.host}:{self.kv_events_port}" if self.kv_events_port else ""

    def argv(self) -> list[str]:
        argv = [str(self.python), "-m", ENTRYPOINT, "--model", str(self.model)]
        argv += ["--host", self.host, "--port", str(self.port), "--dtype", self.dtype]
        # Usage then carries cached prompt tokens, which the adapter reports as ours does.
        argv.append("--enable-prompt-tokens-details")
        if self.served_model_name:
            argv += ["--served-model-name", self.served_model_name]
        if self.enforce_eager:
            argv.append("--enforce-eager")
        if self.max_model_len:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.max_num_seqs:
            argv += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.kv_events_port:
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                # vLLM's publisher binds only a wildcard endpoint.
                "endpoint": f"tcp://*:{self.kv_events_port}",
                "topic": "kv-events",
            }
            argv += ["--kv-events-config", json.dumps(events)]
        return argv + self.extra_args

    def env(self) -> dict[str, str]:
        env = {
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        if self.cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpus
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        if "--enable-lora" in self.extra_args:
            # The engine in front loads and unloads adapters through vLLM's runtime API
            # (engine.proto's LoadAdapter), which vLLM serves only when told to.
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        return env


def vllm_process(config: VllmConfig, name: str, log_path: Path) -> ManagedProcess:
    """vLLM as a child process, ready once /health answers 200."""
    log.info(
        "vllm_cpu_mode",
        name=name,
        dtype=config.dtype,
        enforce_eager=config.enforce_eager,
        reason=config.mode_reason,
    )
    return ManagedProcess(
        name,
        config.argv(),
        log_path,
        env=config.env(),
        probe=f"{config.url}/health",
        stop_group=True,
    )


@dataclass
class VllmServer:
    """One vLLM server for a test session or a benchmark: `with VllmServer(...).start():`."""

    config: VllmConfig
    log_path: Path
    name: str = "vllm"
    startup_timeout: float = 600.0
    stop_timeout: float = 30.0
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return self.config.url

    def start(self) -> "VllmServer":
        """Start it and wait for /health; StartupError with the log tail if it dies or is late."""
        self.process = vllm_process(self.config, self.name, self.log_path)
        self.process.start()
        try:
            # In a thread of its own: callers may be inside an event loop already.
            with ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, self.ready()).result()
        except BaseException:
            self.stop()
            raise
        return self

    async def ready(self) -> None:
        await wait_ready(self.process, self.process.probe, self.startup_timeout)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(self.stop_timeout)

    def __enter__(self) -> "VllmServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
