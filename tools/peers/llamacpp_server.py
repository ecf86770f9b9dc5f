"""llama.cpp's OpenAI-compatible server (llama-cpp-python's) as a peer process.

It loads the GGUF file itself (no Hugging Face folder), serves one request
at a time, and answers /v1/models once the model is loaded: that is when it
is ready. It runs from its own venv (maas_tools.peers.venv) under
maas_tools.local's guard, like every child of ours, so it never outlives the
process that started it.
"""

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from maas_services.common.model_files import DEFAULT_MODEL_ID, default_model_path
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess
from maas_tools.local.readiness import wait_ready
from maas_tools.peers.venv import ensure, llama_peer


@dataclass
class LlamaCppConfig:
    log_path: Path
    model: Path = field(default_factory=default_model_path)
    # Its default is half the cores for decoding (all for prompts): name both.
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    # Tokens of context; its own default, named so a run records it.
    context: int = 2048
    # The name clients send as "model".
    alias: str = DEFAULT_MODEL_ID
    host: str = "127.0.0.1"
    startup_timeout: float = 300.0
    stop_timeout: float = 30.0


def server_argv(python: Path, config: LlamaCppConfig, port: int) -> list[str]:
    return [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(config.model),
        "--model_alias",
        config.alias,
        "--n_threads",
        str(config.threads),
        "--n_threads_batch",
        str(config.threads),
        "--n_ctx",
        str(config.context),
        "--host",
        config.host,
        "--port",
        str(port),
    ]


@contextlib.asynccontextmanager
async def llamacpp_server(config: LlamaCppConfig) -> AsyncIterator[str]:
    """Starts the server (building its venv on first use), yields its /v1 URL, stops it."""
    port = free_port(config.host)
    argv = server_argv(ensure(llama_peer()), config, port)
    process = ManagedProcess("llama.cpp", argv, config.log_path)
    base = f"http://{config.host}:{port}/v1"
    process.start()
    try:
        await wait_ready(process, f"{base}/models", config.startup_timeout)
        yield base
    finally:
        process.stop(config.stop_timeout)
