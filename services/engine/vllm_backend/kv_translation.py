"""vLLM's KV-cache events, restated in our block hashes.

vLLM hashes blocks its own way (sha256 over its own encoding, seeded per
process), so the router, which hashes prompts with services/common/block_hash.py,
cannot use vLLM's hashes. A BlockStored event carries what ours need: the
blocks' token ids and the parent block's hash. The parent's vLLM hash maps to
our hash (it was stored earlier), and each of our hashes chains from it, so
ours are exact. The map holds the blocks vLLM caches now: a BlockRemoved
drops the entries, AllBlocksCleared all of them.

The salt. Ours covers every block of a request (request_salt: engine salt and
tenant); vLLM's cache_salt covers the first block only, and the adapter sends
a digest of our request salt as it (cache_salt.py). vLLM's events publish that
digest among the first block's extra keys, so the root block's salt is the one
the book remembers for it, and each later block inherits its parent's. A block
whose parent or salt we do not know (stored before we subscribed, in events we
lost, or by a caller other than us) cannot be restated and is left out: the
router then sees less than vLLM holds, never more.

Events are msgspec-msgpack: each batch is [ts, events, dp_rank?] and each event
a map tagged by "type" (vllm/distributed/kv_events.py, vLLM 0.32).
"""

from collections.abc import Hashable

from maas_services.common.block_hash import hash_block
from maas_services.engine.core.protocol import CLEARED, EVICTED, STORED, KvEvent
from maas_services.engine.vllm_backend.cache_salt import SaltBook

Events = list[KvEvent]


class KvTranslator:
    def __init__(self, block_size: int, salts: SaltBook):
        self.block_size = block_size  # the one GetLoad reports, so the router's hashes agree
        # vLLM block hash (bytes, or int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
        # -> (our hash, the salt of the prefix it ends)
        self._ours: dict[Hashable, tuple[int, str]] = {}
        self._salts = salts

    def held(self) -> list[int]:
        return [ours for ours, _ in self._ours.values()]

    def clear(self) -> Events:
        self._ours.clear()
        return [(CLEARED, [])]

    def apply(self, events: list[dict]) -> Events:
        out: Events = []
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                hashes = self._stored(event)
                if hashes:
                    out.append((STORED, hashes))
            elif kind == "BlockRemoved":
                hashes = [
                    ours
                    for h in event["block_hashes"]
                    if (ours := self._ours.pop(h, (None,))[0]) is not None
                ]
                if hashes:
                    out.append((EVICTED, hashes))
            elif kind == "AllBlocksCleared":
                out.extend(self.clear())
        return out

    def _stored(self, event: dict) -> list[int]:
        size, hashes, tokens = event["block_size"], event["block_hashes"], event["token_ids"]
        if size != self.block_size or len(tokens) != len(hashes) * size:
            return []  # another KV group's blocks, or a shape we cannot align
        parent_hash = event.get("parent_block_hash")
        if parent_hash is None:
            parent, salt = None, self._salts.ours(_salt((event.get("extra_keys") or [None])[0]))
            if salt is None:
                return []
        elif (known := self._ours.get(parent_hash)) is not None:
            parent, salt = known
        else:
            return []
        stored = []
        for i, vllm_hash in enumerate(hashes):
            parent = hash_block(parent, tokens[i * size : (i + 1) * size], salt)
            self._ours[vllm_hash] = (parent, salt)
            stored.append(parent)
        return stored


def _salt(extra_keys) -> str:
    # The first block's keys are, in order, a LoRA name, (mm id, offset)
    # pairs, the cache salt, prompt-embedding digests (bytes): the salt is
    # the last string. The adapter sends no multimodal input, and the salt
    # covers the LoRA name too (request_salt), so the name itself is not needed.
    strings = [key for key in extra_keys or () if isinstance(key, str)]
    return strings[-1] if strings else ""
