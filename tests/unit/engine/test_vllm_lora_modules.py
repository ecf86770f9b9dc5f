"""The vLLM backend's start loads --lora-modules (MAAS_LORA_MODULES) into vLLM, parsed
as the native engine parses them, replacing one vLLM holds from another folder, and
fails at the first vLLM refuses. vLLM's LoRA API here is a stand-in that answers as
vLLM 0.32 does; against a real vLLM: tests/integration/vllm/test_vllm_lora.py."""

import json
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from maas_services.engine.settings import EngineSettings
from maas_services.engine.vllm_backend.server import load_lora_modules

BASE = "smollm2-vllm"
MAX_LORAS = 2


class VllmLora:
    """vLLM's /v1/models and runtime LoRA routes, over what it holds."""

    def __init__(self, held: dict[str, str] | None = None):
        self.held = dict(held or {})  # name -> folder
        self.calls: list[tuple[str, str]] = []  # (route, adapter name)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            adapters = [{"id": n, "root": s, "parent": BASE} for n, s in self.held.items()]
            return httpx.Response(200, json={"data": [{"id": BASE}, *adapters]})
        body = json.loads(request.content)
        name = body["lora_name"]
        self.calls.append((path, name))
        if path == "/v1/unload_lora_adapter":
            if self.held.pop(name, None) is None:
                return httpx.Response(404, json={"error": {"message": f"{name} not found"}})
            return httpx.Response(200, text="unloaded")
        if name in self.held:
            return httpx.Response(400, json={"error": {"message": f"{name} already loaded"}})
        if not (Path(body["lora_path"]) / "adapter_config.json").is_file():
            message = f"Loading lora {name} failed: No adapter found for {body['lora_path']}"
            return httpx.Response(500, json={"error": {"message": message}})
        self.held[name] = body["lora_path"]
        return httpx.Response(200, text="loaded")


def peft_folder(root: Path, name: str) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    return str(folder)


def client_of(vllm: VllmLora) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url="http://vllm", transport=httpx.MockTransport(vllm.handle))


async def test_missing_ones_load_and_one_held_from_another_folder_is_replaced(tmp_path):
    sql, chat, old = (peft_folder(tmp_path, n) for n in ("sql", "chat", "old"))
    # An adapter restarted beside a running vLLM: chat as the list says, sql from before.
    vllm = VllmLora({"sql": old, "chat": chat})
    async with client_of(vllm) as client:
        await load_lora_modules(client, {"sql": sql, "chat": chat}, MAX_LORAS)
    assert vllm.held == {"sql": sql, "chat": chat}
    assert ("/v1/unload_lora_adapter", "sql") in vllm.calls
    assert ("/v1/unload_lora_adapter", "chat") not in vllm.calls


async def test_a_folder_vllm_refuses_fails_the_start_and_loads_nothing_after_it(tmp_path):
    good = peft_folder(tmp_path, "good")
    vllm = VllmLora()
    modules = {"broken": str(tmp_path / "missing"), "good": good}
    async with client_of(vllm) as client:
        with pytest.raises(SystemExit) as exited:
            await load_lora_modules(client, modules, MAX_LORAS)
    assert exited.value.code == 1
    assert vllm.held == {}


async def test_a_name_no_request_could_send_fails_the_start_before_vllm_is_asked(tmp_path):
    vllm = VllmLora()
    async with client_of(vllm) as client:
        with pytest.raises(SystemExit):
            await load_lora_modules(client, {"a,b": peft_folder(tmp_path, "ab")}, MAX_LORAS)
    assert vllm.calls == []


def test_the_vllm_backend_parses_maas_lora_modules_as_the_native_engine(monkeypatch):
    monkeypatch.setenv("MAAS_LORA_MODULES", json.dumps(["sql=/adapters/sql", "chat"]))
    with pytest.raises(ValidationError, match="'chat' is not NAME=PATH"):
        EngineSettings(backend="vllm")
    monkeypatch.setenv("MAAS_LORA_MODULES", json.dumps(["sql=/a", "sql=/b"]))
    with pytest.raises(ValidationError, match="the adapter name 'sql' is given twice"):
        EngineSettings(backend="vllm")
