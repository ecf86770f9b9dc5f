"""`maas up --engine-backend vllm`: a vLLM server behind each engine replica.

Each replica is two children: vLLM's OpenAI server (maas_tools.peers.vllm_server)
and our engine in front of it (`maas serve engine --backend vllm`), which
speaks maas.v1.Engine to the router and gateway, so routing, limits and
billing are the native path's. What vLLM needs is made once before the first
start: its venv (maas_tools.peers.venv, minutes on first use, with pip's lines
as progress) and the Hugging Face folder of the bundled GGUF, derived in a
child process so `maas up` itself never loads torch.

Replicas split the cores between them (vLLM's OpenMP threads are bound to
their share), so two replicas on two cores do not fight over both.

Each vLLM server demands a key made for it at start (VLLM_API_KEY in its
environment, and in its engine's, never on a command line: another user of the
host reads /proc/PID/cmdline but not the environment), so another process on
the laptop cannot call it around the gateway's keys and limits.
"""

import asyncio
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path

from maas_tools.local.readiness import StartupError
from maas_tools.peers.venv import VLLM, ensure
from maas_tools.peers.vllm_server import VllmConfig


@dataclass
class VllmOptions:
    # GiB of KV cache per replica (VLLM_CPU_KVCACHE_SPACE).
    kv_cache_gib: int = 1
    # None: eager where that is right on this CPU, compiled where not (AMX with bf16:
    # services/common/vllm_cpu_mode.py); False: compiled (minutes at first start on a CPU).
    enforce_eager: bool | None = None
    # Requests each replica runs at once; its engine in front is told the same.
    max_num_seqs: int = 64
    # Passed verbatim to every vLLM server, e.g. ["--max-num-batched-tokens", "1024"].
    args: list[str] = field(default_factory=list)


@dataclass
class VllmRuntime:
    python: Path
    model: Path


async def prepare() -> VllmRuntime:
    """vLLM's interpreter and the model folder it loads, made once."""
    python = await asyncio.to_thread(ensure, VLLM)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "maas_tools.peers.model_folder",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    if child.returncode:
        raise StartupError(f"could not derive vLLM's model folder:\n{err.decode()[-2000:]}")
    return VllmRuntime(python=python, model=Path(out.decode().split()[-1]))


def replica_cpus(index: int, replicas: int, cores: list[int] | None = None) -> str:
    """Replica `index`'s share of the cores, as VLLM_CPU_OMP_THREADS_BIND reads it;
    "" (vLLM's own choice) for a single replica."""
    if replicas <= 1:
        return ""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    share = max(1, len(cores) // replicas)
    start = (index * share) % len(cores)
    return ",".join(str(core) for core in cores[start : start + share])


def replica_config(
    runtime: VllmRuntime, options: VllmOptions, model_id: str, index: int, replicas: int, host: str
) -> VllmConfig:
    return VllmConfig(
        python=runtime.python,
        model=runtime.model,
        served_model_name=model_id,
        host=host,
        enforce_eager=options.enforce_eager,
        kv_cache_gib=options.kv_cache_gib,
        # The engine in front turns these into the router's prefix index.
        kv_events_port=0,
        cpus=replica_cpus(index, replicas),
        max_num_seqs=options.max_num_seqs,
        extra_args=options.args,
        api_key=secrets.token_urlsafe(32),
    )


def engine_flags(config: VllmConfig) -> dict[str, str]:
    """`maas serve engine` flags that put it in front of this vLLM server."""
    return {
        "backend": "vllm",
        "vllm-url": config.url,
        "vllm-kv-events-endpoint": config.kv_events_endpoint,
        "max-num-seqs": str(config.max_num_seqs),
    }


def engine_env(config: VllmConfig) -> dict[str, str]:
    """The environment that lets `maas serve engine` call this vLLM server: its key."""
    return {"VLLM_API_KEY": config.api_key} if config.api_key else {}
