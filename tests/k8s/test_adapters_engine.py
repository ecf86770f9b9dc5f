"""adapter_sync against a real engine: `maas serve engine` over gRPC, the real SmolLM2
and the LoRA adapter trained by tests/lora_fixture.py.

What the fake engines of test_adapters_sync stand in for, checked once for real: a
PEFT folder loads by the operator's LoadAdapter and shows in the engine's load
report, a broken one becomes AdapterInvalid in the engine's own words, and an
adapter gone from the spec is unloaded.
"""

import shutil
import time

import grpc
import pytest

from maas.v1 import engine_pb2, engine_pb2_grpc
from maas_operator.modeldeployment.adapter_spec import adapters
from maas_operator.modeldeployment.adapter_sync import AdapterCalls, sync_adapters
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.drain import Replica
from maas_operator.modeldeployment.grpc_clients import load_adapter, unload_adapter
from tests.integration.engine.conftest import engine  # noqa: F401  (the served engine)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CALLS = AdapterCalls(load_adapter, unload_adapter)


async def replica(address: str) -> Replica:
    """The engine as the router reports it: its LoadReport's adapters."""
    async with grpc.aio.insecure_channel(address) as channel:
        load = await engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest())
    return Replica("engine-0", address, True, False, 0, 0, 0, tuple(load.adapters))


async def test_a_real_engine_loads_reports_refuses_and_unloads_what_the_spec_says(
    engine,  # noqa: F811
    lora_adapter_dir,
    tmp_path,
):
    _, address = engine
    # The weights file gone: the engine must refuse it at load, naming it.
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(lora_adapter_dir / "adapter_config.json", broken)
    spec = defaulted_spec(
        {
            "adapters": [
                {"name": "upper", "source": {"uri": f"file://{lora_adapter_dir}"}},
                {"name": "broken", "source": {"uri": f"file://{broken}"}},
            ]
        }
    )
    report = await sync_adapters(CALLS, adapters(spec), [await replica(address)], [], time.time())
    entries = {e["name"]: e for e in report.entries}
    assert entries["upper"]["state"] == "Loaded"
    assert "upper" in (await replica(address)).adapters
    assert entries["broken"]["state"] == "Failed"
    assert entries["broken"]["reason"] == "AdapterInvalid"
    assert entries["broken"]["message"].startswith("adapter 'broken' on engine-0: ")
    assert "adapter_model.safetensors" in entries["broken"]["message"]
    assert (report.condition.status, report.condition.reason) == (False, "AdapterInvalid")
    assert "broken" not in (await replica(address)).adapters, "a refused adapter leaves nothing"

    # Gone from the spec: unloaded, and the engine no longer reports it.
    report = await sync_adapters(CALLS, [], [await replica(address)], report.entries, time.time())
    assert report.entries == [] and report.condition.status
    assert "upper" not in (await replica(address)).adapters
