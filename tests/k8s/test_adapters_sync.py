"""adapter_sync: preload adapters loaded onto ready replicas, removed ones unloaded,
status.adapters and AdaptersReady from what the engines answer.

Each replica is a gRPC server on loopback answering LoadAdapter and UnloadAdapter as
engine.proto says (a folder without adapter_config.json is INVALID_ARGUMENT), called
through the operator's own client (grpc_clients.py).
"""

import asyncio
import contextlib
import json
from pathlib import Path

import grpc
import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_operator.modeldeployment.adapter_spec import adapters
from maas_operator.modeldeployment.adapter_sync import (
    LOADS_PER_REPLICA,
    RETRY_REFUSED_SECONDS,
    AdapterCalls,
    sync_adapters,
)
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.drain import Replica
from maas_operator.modeldeployment.grpc_clients import load_adapter, unload_adapter
from tests.k8s.fake_pool import FakeEngine, FakeReplica, _serve

CALLS = AdapterCalls(load_adapter, unload_adapter)
NOW = 1_000_000.0


class AdapterEngine(FakeEngine):
    """An engine's adapter RPCs: a PEFT folder loads, anything else is INVALID_ARGUMENT."""

    def __init__(self, replica: FakeReplica, loaded: dict[str, str] | None = None):
        super().__init__(replica)
        self.loaded = dict(loaded or {})  # name -> source
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.disabled = False
        self.hold: asyncio.Event | None = None  # set: LoadAdapter answers once it is

    async def LoadAdapter(self, request, context):
        self.loads.append(request.name)
        if self.hold is not None:
            await self.hold.wait()
        if self.disabled:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "max_loras is 0")
        if not (Path(request.source) / "adapter_config.json").is_file():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{request.source}: no adapter_config.json (not a PEFT folder)",
            )
        self.loaded[request.name] = request.source
        return engine_pb2.AdapterStatus(name=request.name, rank=8, source=request.source)

    async def UnloadAdapter(self, request, context):
        self.unloads.append(request.name)
        found = self.loaded.pop(request.name, None) is not None
        return engine_pb2.UnloadAdapterResponse(found=found)


def peft_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def spec_of(*entries: tuple[str, Path, str]) -> dict:
    return defaulted_spec(
        {
            "adapters": [
                {"name": name, "source": {"uri": f"file://{path}"}, "load": load}
                for name, path, load in entries
            ]
        }
    )


@contextlib.asynccontextmanager
async def engines(count: int):
    servers, found = [], []
    try:
        for i in range(count):
            replica = FakeReplica(f"smol-engine-{i}", None, "")
            engine = AdapterEngine(replica)
            replica.server, replica.address = await _serve(
                engine_pb2_grpc.add_EngineServicer_to_server, engine
            )
            servers.append(replica.server)
            found.append((replica, engine))
        yield found
    finally:
        for server in servers:
            await server.stop(None)


def reported(pool, draining: str = "") -> list[Replica]:
    """The router's view: each replica's LoadReport.adapters."""
    return [
        Replica(r.pod, r.address, True, r.pod == draining, 0, 0, 0, tuple(e.loaded))
        for r, e in pool
    ]


def by_name(report) -> dict[str, dict]:
    return {e["name"]: e for e in report.entries}


async def test_preload_adapters_load_onto_every_ready_replica_and_on_demand_ones_are_reported(
    tmp_path,
):
    sql, chat = peft_folder(tmp_path, "sql"), peft_folder(tmp_path, "chat")
    spec = spec_of(("sql", sql, "preload"), ("chat", chat, "on-demand"))
    async with engines(3) as pool:
        pool[1][1].loaded["chat"] = str(chat)  # a request loaded it there
        report = await sync_adapters(
            CALLS, adapters(spec), reported(pool, draining="smol-engine-2"), [], NOW
        )
        assert [e.loads for _, e in pool] == [["sql"], ["sql"], []], "none on a draining one"
        entries = by_name(report)
        assert entries["sql"] == {
            "name": "sql",
            "source": str(sql),
            "load": "preload",
            "replicas": ["smol-engine-0", "smol-engine-1"],
            "state": "Loaded",
        }
        assert entries["chat"]["state"] == "OnDemand"
        assert entries["chat"]["replicas"] == ["smol-engine-1"]
        assert report.condition.status and report.condition.reason == "AdaptersLoaded"

        # Reported loaded now: the next tick calls nothing.
        again = await sync_adapters(CALLS, adapters(spec), reported(pool), report.entries, NOW + 1)
        assert [e.loads for _, e in pool] == [["sql"], ["sql"], ["sql"]]
        assert by_name(again)["sql"]["replicas"] == [
            "smol-engine-0",
            "smol-engine-1",
            "smol-engine-2",
        ]


async def test_an_invalid_adapter_is_a_condition_in_the_engines_words_and_not_retried_at_once(
    tmp_path,
):
    good, bad = peft_folder(tmp_path, "good"), tmp_path / "missing"
    spec = spec_of(("good", good, "preload"), ("bad", bad, "preload"))
    async with engines(2) as pool:
        report = await sync_adapters(CALLS, adapters(spec), reported(pool), [], NOW)
        entry = by_name(report)["bad"]
        assert entry["state"] == "Failed" and entry["reason"] == "AdapterInvalid"
        assert entry["message"].startswith("adapter 'bad' on smol-engine-")
        assert f"{bad}: no adapter_config.json (not a PEFT folder)" in entry["message"]
        assert by_name(report)["good"]["state"] == "Loaded", "one bad adapter stops no other"
        condition = report.condition
        assert (condition.type, condition.status, condition.reason) == (
            "AdaptersReady",
            False,
            "AdapterInvalid",
        )
        assert "no adapter_config.json" in condition.message
        assert report.events == [("Warning", "AdapterInvalid", entry["message"])]

        # The same files give the same answer: not asked again until the retry time.
        later = await sync_adapters(CALLS, adapters(spec), reported(pool), report.entries, NOW + 5)
        assert [e.loads.count("bad") for _, e in pool] == [1, 1]
        assert by_name(later)["bad"] == entry and later.events == []

        # Fixed in place: tried again after the retry time, and then loaded.
        peft_folder(tmp_path, "missing")
        fixed = await sync_adapters(
            CALLS, adapters(spec), reported(pool), later.entries, NOW + RETRY_REFUSED_SECONDS
        )
        assert by_name(fixed)["bad"]["state"] == "Loaded"
        assert "reason" not in by_name(fixed)["bad"]
        assert fixed.condition.status


async def test_a_slot_shortage_is_retried_every_tick_and_lora_disabled_is_said(tmp_path):
    spec = spec_of(("sql", peft_folder(tmp_path, "sql"), "preload"))
    async with engines(1) as pool:
        pool[0][1].disabled = True
        report = await sync_adapters(CALLS, adapters(spec), reported(pool), [], NOW)
        assert report.condition.reason == "LoraDisabled"
        assert "max_loras is 0" in report.condition.message


async def test_removed_adapters_are_unloaded_and_a_moved_one_reloaded(tmp_path):
    sql, tone = peft_folder(tmp_path, "sql"), peft_folder(tmp_path, "tone")
    moved = peft_folder(tmp_path, "sql-v2")
    before = spec_of(("sql", sql, "preload"), ("tone", tone, "preload"))
    async with engines(2) as pool:
        first = await sync_adapters(CALLS, adapters(before), reported(pool), [], NOW)
        assert all(set(e.loaded) == {"sql", "tone"} for _, e in pool)

        after = spec_of(("sql", moved, "preload"))
        report = await sync_adapters(CALLS, adapters(after), reported(pool), first.entries, NOW)
        assert [sorted(e.unloads) for _, e in pool] == [["sql", "tone"], ["sql", "tone"]]
        assert all(e.loaded == {"sql": str(moved)} for _, e in pool)
        assert [e["name"] for e in report.entries] == ["sql"]
        assert by_name(report)["sql"]["source"] == str(moved)


async def test_a_removed_adapter_an_engine_cannot_unload_yet_stays_listed_as_unloading(tmp_path):
    sql = peft_folder(tmp_path, "sql")
    async with engines(1) as pool:
        first = await sync_adapters(
            CALLS, adapters(spec_of(("sql", sql, "preload"))), reported(pool), [], NOW
        )
        view = reported(pool)
        await pool[0][0].server.stop(None)  # gone before it could unload
        report = await sync_adapters(CALLS, [], view, first.entries, NOW + 1)
        (entry,) = report.entries
        assert entry["state"] == "Unloading" and entry["replicas"] == ["smol-engine-0"]
        assert entry["message"].startswith("UnloadAdapter failed on smol-engine-0: ")


async def test_no_ready_replica_leaves_preload_adapters_pending(tmp_path):
    spec = spec_of(("sql", peft_folder(tmp_path, "sql"), "preload"))
    report = await sync_adapters(CALLS, adapters(spec), [], [], NOW)
    assert by_name(report)["sql"]["state"] == "Pending"
    assert report.condition.status and report.condition.reason == "NoReadyReplicas"


@pytest.mark.timeout(60)
async def test_the_largest_spec_loads_a_bounded_number_per_replica_each_tick(tmp_path):
    """64 preload adapters (the schema's maximum): one tick asks each replica for at most
    LOADS_PER_REPLICA, so the tick (and the engines' time) stays short; the rest follow."""
    folders = [(f"a{i:02d}", peft_folder(tmp_path, f"a{i:02d}"), "preload") for i in range(64)]
    wanted = adapters(spec_of(*folders))
    async with engines(2) as pool:
        report = await sync_adapters(CALLS, wanted, reported(pool), [], NOW)
        assert [len(e.loads) for _, e in pool] == [LOADS_PER_REPLICA, LOADS_PER_REPLICA]
        assert report.condition.reason == "AdaptersLoading"
        assert report.condition.message.startswith("a04 on 0 of 2 replicas")
        ticks = 1
        while not report.condition.status:
            report = await sync_adapters(CALLS, wanted, reported(pool), report.entries, NOW)
            ticks += 1
        assert ticks == 64 // LOADS_PER_REPLICA
        assert [len(e.loads) for _, e in pool] == [64, 64], "each loaded exactly once"
