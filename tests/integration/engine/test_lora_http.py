"""LoRA adapters at the engine's OpenAI HTTP front (`maas serve engine --http-port`).

One engine with the front on, the service token set and an adapter from
--lora-modules (tests/lora_fixture.py's, which answers in upper case): `model`
names the adapter on chat, completions and embeddings, and anything else not
served is a 404 model_not_found; /v1/models lists adapters with their parent;
vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter load and unload
them, behind the token, with OpenAI error bodies for bad folders and names not
loaded.
"""

import asyncio
import json
import shutil

import httpx
import pytest

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.ports import free_port
from maas_tools.local.processes import ManagedProcess, serve_argv
from maas_tools.local.readiness import wait_ready

pytestmark = pytest.mark.slow

TOKEN = "lora-front-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PINNED = "shared"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def front(tmp_path_factory, lora_adapter_dir):
    """The front's base URL."""
    port, http_port = free_port(), free_port()
    flags = {
        "port": port,
        "metrics-port": free_port(),
        "http-port": http_port,
        "dtype": "float32",
        "max-num-seqs": 2,
        "lora-modules": [f"{PINNED}={lora_adapter_dir}"],
    }
    process = ManagedProcess(
        "engine",
        serve_argv("engine", flags),
        tmp_path_factory.mktemp("lora-front") / "engine.log",
        env={"MAAS_SERVICE_TOKEN": TOKEN},
    )
    process.start()
    asyncio.run(wait_ready(process, f"127.0.0.1:{port}", timeout=300))
    yield f"http://127.0.0.1:{http_port}"
    process.stop(timeout=30)


@pytest.fixture
async def client(front):
    async with httpx.AsyncClient(base_url=front, timeout=120, headers=AUTH) as client:
        yield client


async def chat(client, model: str) -> httpx.Response:
    body = {"model": model, "messages": QUESTION, "temperature": 0, "max_tokens": 12}
    return await client.post("/v1/chat/completions", json=body)


async def test_models_list_adapters_with_their_parent(client):
    models = (await client.get("/v1/models")).json()["data"]
    assert [(m["id"], m.get("parent")) for m in models] == [
        (DEFAULT_MODEL_ID, None),
        (PINNED, DEFAULT_MODEL_ID),
    ]


async def test_model_names_the_adapter_on_every_endpoint(client):
    base, tuned = await chat(client, DEFAULT_MODEL_ID), await chat(client, PINNED)
    assert tuned.status_code == 200, tuned.text
    assert tuned.json()["model"] == PINNED
    text = tuned.json()["choices"][0]["message"]["content"]
    assert text == text.upper() and text != base.json()["choices"][0]["message"]["content"]
    completion = await client.post(
        "/v1/completions", json={"model": PINNED, "prompt": "Say hello.", "max_tokens": 4}
    )
    assert completion.status_code == 200, completion.text
    assert completion.json()["model"] == PINNED
    embeddings = await client.post("/v1/embeddings", json={"model": PINNED, "input": "hello"})
    assert embeddings.status_code == 200, embeddings.text
    assert embeddings.json()["model"] == PINNED
    base_vector = await client.post(
        "/v1/embeddings", json={"model": DEFAULT_MODEL_ID, "input": "hello"}
    )
    # The adapter's layers compute the vector too.
    assert embeddings.json()["data"][0]["embedding"] != base_vector.json()["data"][0]["embedding"]


async def test_a_model_not_served_is_404(client):
    for reply in (
        await chat(client, "not-loaded"),
        await client.post("/v1/embeddings", json={"model": "not-loaded", "input": "x"}),
    ):
        assert reply.status_code == 404
        assert reply.json()["error"]["code"] == "model_not_found"


async def test_load_and_unload_as_vllm_spells_them(client, lora_adapter_dir):
    body = {"lora_name": "upper", "lora_path": str(lora_adapter_dir)}
    loaded = await client.post("/v1/load_lora_adapter", json=body)
    assert loaded.status_code == 200, loaded.text
    assert "added successfully" in loaded.text
    assert "upper" in [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert (await chat(client, "upper")).json()["choices"] == (await chat(client, PINNED)).json()[
        "choices"
    ]
    unloaded = await client.post("/v1/unload_lora_adapter", json={"lora_name": "upper"})
    assert unloaded.status_code == 200, unloaded.text
    assert (await chat(client, "upper")).status_code == 404
    again = await client.post("/v1/unload_lora_adapter", json={"lora_name": "upper"})
    assert again.status_code == 404
    assert again.json()["error"]["code"] == "model_not_found"


async def test_bad_loads_get_openai_errors(client, lora_adapter_dir, tmp_path):
    spoiled = shutil.copytree(lora_adapter_dir, tmp_path / "spoiled")
    config = json.loads((spoiled / "adapter_config.json").read_text())
    (spoiled / "adapter_config.json").write_text(json.dumps({**config, "r": 64}))
    for body, words in [
        ({"lora_name": "spoiled", "lora_path": str(spoiled)}, "max-lora-rank"),
        ({"lora_name": "nowhere", "lora_path": str(tmp_path / "nowhere")}, "missing"),
        ({"lora_name": "no-path"}, "lora_path"),
        ({"lora_name": "", "lora_path": str(lora_adapter_dir)}, "lora_name"),
        ({"lora_name": "x" * 1000, "lora_path": str(lora_adapter_dir)}, "lora_name"),
    ]:
        reply = await client.post("/v1/load_lora_adapter", json=body)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["type"] == "invalid_request_error"
        assert words in reply.json()["error"]["message"]
    assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]][1:] == [PINNED]


async def test_loads_in_a_loop_cost_only_their_sender(client, lora_adapter_dir):
    """Four callers load and unload over HTTP as fast as the engine answers while two
    base-model chats run: the chats answer exactly as alone."""
    alone = (await chat(client, DEFAULT_MODEL_ID)).json()["choices"]
    stop = asyncio.Event()

    async def churn(caller: int) -> int:
        rounds = 0
        while not stop.is_set():
            name = f"churn-{caller}"
            body = {"lora_name": name, "lora_path": str(lora_adapter_dir)}
            loaded = await client.post("/v1/load_lora_adapter", json=body)
            assert loaded.status_code in (200, 503), loaded.text  # 503: no slot, its own
            await client.post("/v1/unload_lora_adapter", json={"lora_name": name})
            rounds += 1
        return rounds

    churners = [asyncio.create_task(churn(caller)) for caller in range(4)]
    chats = await asyncio.gather(*(chat(client, DEFAULT_MODEL_ID) for _ in range(2)))
    stop.set()
    assert sum(await asyncio.gather(*churners)) >= 4
    assert [reply.json()["choices"] for reply in chats] == [alone, alone]
    assert (await client.get("/health")).status_code == 200


async def test_loads_need_the_token(front, lora_adapter_dir):
    async with httpx.AsyncClient(base_url=front, timeout=30) as anonymous:
        reply = await anonymous.post(
            "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(lora_adapter_dir)}
        )
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "invalid_api_key"
