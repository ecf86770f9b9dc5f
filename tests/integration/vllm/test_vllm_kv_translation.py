"""vLLM's event wire format, published on a real ZeroMQ socket, into our hashes.

No vLLM here: the frames are built as vLLM 0.32 builds them
(vllm/distributed/kv_events.py: [topic, 8-byte sequence, msgpack
[ts, events]], events as maps tagged by "type"), so the translation and the
sequence-gap handling are checked on every machine.
"""

import asyncio

import msgspec
import zmq
import zmq.asyncio

from maas_services.common.block_hash import prefix_block_hashes
from maas_services.engine.core.protocol import ADAPTER_LOADED, ADAPTER_UNLOADED
from maas_services.engine.vllm_backend.cache_salt import SaltBook
from maas_services.engine.vllm_backend.kv_subscriber import KvSubscriber
from maas_services.engine.vllm_backend.kv_translation import KvTranslator
from maas_tools.local.ports import free_port

TOKENS = list(range(100, 164))  # four blocks of 16
SALT = "model\x00tenant"
SALTS = SaltBook()
VLLM_SALT = SALTS.vllm_salt(SALT)  # what the adapter sent vLLM for it


def stored(hashes, parent, tokens, salt=VLLM_SALT):
    event = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    if parent is None:
        event["extra_keys"] = [(salt,)] + [None] * (len(hashes) - 1)
    return event


def test_chained_events_give_our_hashes():
    ours = prefix_block_hashes(TOKENS, 16, SALT)
    translator = KvTranslator(16, SALTS)
    assert translator.apply([stored([b"a", b"b"], None, TOKENS[:32])]) == [("stored", ours[:2])]
    # A later event continues from its parent, with the parent's salt.
    assert translator.apply([stored([b"c", b"d"], b"b", TOKENS[32:])]) == [("stored", ours[2:])]
    removed = {"type": "BlockRemoved", "block_hashes": [b"d", b"unknown"], "medium": "GPU"}
    assert translator.apply([removed]) == [("evicted", [ours[3]])]
    assert sorted(translator.held()) == sorted(ours[:3])
    # A parent we never saw: left out rather than guessed.
    assert translator.apply([stored([b"x"], b"never-seen", TOKENS[:16])]) == []
    # A salt we never sent (another caller's request): left out too.
    assert translator.apply([stored([b"y"], None, TOKENS[:16], salt="theirs")]) == []
    assert translator.apply([{"type": "AllBlocksCleared"}]) == [("cleared", [])]
    assert translator.held() == []


async def test_sequence_gap_clears_subscribers():
    port = free_port()
    context = zmq.asyncio.Context()
    # XPUB: a publisher like vLLM's PUB that also says when a subscription arrived.
    publisher = context.socket(zmq.XPUB)
    publisher.bind(f"tcp://127.0.0.1:{port}")
    subscriber = KvSubscriber(f"tcp://127.0.0.1:{port}", KvTranslator(16, SALTS))
    subscriber.start()
    batches = subscriber.batches(["sql"])
    try:
        snapshot = [("cleared", []), ("stored", []), (ADAPTER_LOADED, "sql")]
        assert (await anext(batches)).events == snapshot
        assert await publisher.recv() == b"\x01"  # subscribed to every topic

        async def send(sequence, events):
            payload = msgspec.msgpack.encode([1.0, events])
            await publisher.send_multipart([b"kv-events", sequence.to_bytes(8, "big"), payload])

        await send(0, [stored([b"a"], None, TOKENS[:16])])
        batch = await asyncio.wait_for(anext(batches), 5)
        assert batch.events == [("stored", prefix_block_hashes(TOKENS[:16], 16, SALT))]
        await send(5, [])  # 1..4 lost
        assert (await asyncio.wait_for(anext(batches), 5)).events == [("cleared", [])]
        # The servicer's word of an adapter unloaded (vLLM publishes none).
        subscriber.adapter_changed(ADAPTER_UNLOADED, "sql")
        assert (await anext(batches)).events == [(ADAPTER_UNLOADED, "sql")]
    finally:
        await batches.aclose()
        await subscriber.stop()
        publisher.close(0)
        context.term()
