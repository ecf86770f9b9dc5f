"""Adapters on the engine core: each load and unload is a KV event (and a new
subscriber's snapshot lists the adapters loaded), and a load's folder is read
off the core's thread (services/engine/core/engine_core.py).

The slow read: the adapter's config is a FIFO that the test writes only when it
chooses, so the read is held for as long as the test wants, the worst case of a
slow file. What the running stream does meanwhile shows where the read ran: on
the old code the core thread itself waited in the read, and the stream got no
token until it ended (the guard turns that hang into a failure).
"""

import asyncio
import errno
import os
import shutil
from contextlib import contextmanager, suppress

import pytest

from maas_services.engine.core.protocol import ADAPTER_LOADED, ADAPTER_UNLOADED
from maas_services.engine.lora.errors import AdapterInvalid, AdapterSlotsFull
from tests.integration.engine.core_thread import core_on_thread
from tests.integration.engine.test_llm_engine import greedy, make_engine

pytestmark = pytest.mark.slow

# Not a speed limit: how long a broken build may hang before the test says so.
HANG_GUARD_S = 120
CONFIG = "adapter_config.json"


def guarded(awaitable):
    return asyncio.wait_for(awaitable, HANG_GUARD_S)


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": "Tell a story."}])


@contextmanager
def held_adapter(lora_adapter_dir, where):
    """(folder, its config's text): a copy of the adapter whose config is a FIFO."""
    folder = shutil.copytree(lora_adapter_dir, where)
    config = (folder / CONFIG).read_text()
    (folder / CONFIG).unlink()
    os.mkfifo(folder / CONFIG)
    try:
        yield folder, config
    finally:
        # A reader still waiting (a failed test) gets an end of file, not a hang.
        with suppress(OSError):
            os.close(os.open(folder / CONFIG, os.O_WRONLY | os.O_NONBLOCK))


async def read_in_flight(folder) -> int:
    """The FIFO's write end, once a reader has it open: the load's read has begun."""
    while True:
        try:
            return os.open(folder / CONFIG, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        await asyncio.sleep(0.01)


def release(writer: int, text: str) -> None:
    os.write(writer, text.encode())
    os.close(writer)


def adapter_events(batch) -> list:
    return [event for event in batch.events if event[0] in (ADAPTER_LOADED, ADAPTER_UNLOADED)]


async def test_adapter_changes_are_kv_events_and_a_snapshot_lists_the_adapters(
    model, tokenizer, lora_adapter_dir
):
    source = str(lora_adapter_dir)
    engine = make_engine(model, tokenizer, max_loras=2, max_cpu_loras=2)
    engine.load_adapter("pinned", source, pinned=True)  # as --lora-modules, before the core
    async with core_on_thread(engine) as client:
        events = client.kv_events()
        snapshot = await guarded(anext(events))
        assert snapshot.events[:1] == [("cleared", [])]
        assert adapter_events(snapshot) == [(ADAPTER_LOADED, "pinned")]
        await client.load_adapter("a", source)
        assert adapter_events(await guarded(anext(events))) == [(ADAPTER_LOADED, "a")]
        await client.load_adapter("a", source)  # the same load again: nothing changes
        await client.load_adapter("b", source)  # evicts a, idle, for room
        changed = adapter_events(await guarded(anext(events)))
        assert changed == [(ADAPTER_UNLOADED, "a"), (ADAPTER_LOADED, "b")]
        assert await client.unload_adapter("b")
        assert adapter_events(await guarded(anext(events))) == [(ADAPTER_UNLOADED, "b")]
        # A second subscriber's snapshot: what is loaded now.
        later = client.kv_events()
        assert adapter_events(await guarded(anext(later))) == [(ADAPTER_LOADED, "pinned")]
        await events.aclose()
        await later.aclose()


async def test_streams_keep_stepping_while_an_adapter_is_read(
    model, tokenizer, prompt, lora_adapter_dir, tmp_path
):
    engine = make_engine(model, tokenizer, max_loras=2)
    with held_adapter(lora_adapter_dir, tmp_path / "slow") as (folder, config):
        async with core_on_thread(engine) as client:
            running = client.generate("running", prompt, greedy(64))
            await guarded(anext(running))
            load = asyncio.ensure_future(client.load_adapter("slow", str(folder)))
            writer = await guarded(read_in_flight(folder))
            # Steps the running request got while the load's read was held.
            during = [await guarded(anext(running)) for _ in range(3)]
            assert all(out.token_ids for out in during) and not load.done()
            # An unload behind the load waits its turn: loads and unloads keep their order.
            unload = asyncio.ensure_future(client.unload_adapter("slow"))
            await guarded(anext(running))
            assert not unload.done()
            release(writer, config)
            loaded = await guarded(load)
            assert (loaded.name, loaded.rank) == ("slow", 8)
            assert await guarded(unload) is True
            rest = [out async for out in running]
            assert rest[-1].finish_reason == "length"
            assert client.adapters == []


async def test_a_held_load_is_refused_with_its_codes_and_the_core_serves_on(
    model, tokenizer, prompt, lora_adapter_dir, tmp_path
):
    """Refusals found by the read (a bad folder) or at its install (the slot it was to
    take got busy while it was read) answer as a load on the core's thread did."""
    source = str(lora_adapter_dir)
    engine = make_engine(model, tokenizer, max_loras=1, max_cpu_loras=1)
    with held_adapter(lora_adapter_dir, tmp_path / "bad") as (bad, _):
        async with core_on_thread(engine) as client:
            load = asyncio.ensure_future(client.load_adapter("bad", str(bad)))
            release(await guarded(read_in_flight(bad)), '{"r": 8, "lora_al')
            with pytest.raises(AdapterInvalid, match="unreadable"):
                await guarded(load)
            await client.load_adapter("a", source)
            with held_adapter(lora_adapter_dir, tmp_path / "b") as (folder, config):
                # a is idle: b may take its slot, and begins to read.
                load = asyncio.ensure_future(client.load_adapter("b", str(folder)))
                writer = await guarded(read_in_flight(folder))
                busy = client.generate("uses-a", prompt, greedy(32), adapter="a")
                await guarded(anext(busy))
                release(writer, config)
                with pytest.raises(AdapterSlotsFull):
                    await guarded(load)
                assert client.adapters == ["a"]
                rest = [out async for out in busy]
                assert rest[-1].finish_reason == "length"
