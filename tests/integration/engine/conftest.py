"""Shared engine-test fixtures: the real model, transformers' greedy outputs, a served engine."""

import asyncio

import pytest
import torch

from maas_services.common.model_files import ModelNotFoundError, default_model_path
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine.loader import load_model
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready
from tests.hf_reference import hf_reference_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def smollm_path():
    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def model(smollm_path):
    return load_model(smollm_path, dtype=torch.float32, progress=False)


@pytest.fixture(scope="module")
def tokenizer(smollm_path):
    return load_tokenizer(smollm_path)


@pytest.fixture(scope="session")
def hf_tokenizer(smollm_path):
    return transformers.AutoTokenizer.from_pretrained(
        str(smollm_path.parent), gguf_file=smollm_path.name
    )


@pytest.fixture(scope="session")
def hf_model(smollm_path):
    return hf_reference_model(smollm_path)


def transformers_greedy(model, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """A transformers model's greedy continuation of prompt ids, exactly new_tokens long."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
    return out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    """transformers' greedy continuation of prompt ids, ignoring EOS, memoised."""
    memo: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def greedy(prompt_ids: list[int], new_tokens: int) -> list[int]:
        key = (tuple(prompt_ids), new_tokens)
        if key not in memo:
            memo[key] = transformers_greedy(hf_model, prompt_ids, new_tokens)
        return memo[key]

    return greedy


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """`maas serve engine` as a process, one per test module: (process, address)."""
    port = free_port()
    process = ManagedProcess(
        "engine",
        serve_argv(
            "engine",
            {"port": port, "metrics-port": free_port(), "dtype": "float32", "max-num-seqs": 2},
        ),
        tmp_path_factory.mktemp("engine") / "engine.log",
    )
    process.start()
    address = f"127.0.0.1:{port}"
    asyncio.run(wait_ready(process, address, timeout=300))
    yield process, address
    process.stop(timeout=30)
