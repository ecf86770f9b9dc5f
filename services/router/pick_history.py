"""The router's own record of which prompt blocks it sent where.

A guess, used where the engines' events don't (yet) say: between a pick and
the engine storing that prompt's blocks (a prefill takes a while, and a burst of
requests sharing a new prefix should all land on the replica computing it), and
for an engine whose event stream is down or unsupported. Entries expire after a
TTL, and an engine event about a block replaces the guess with the fact.
"""

from collections import OrderedDict


class PickHistory:
    def __init__(self, ttl_seconds: float, max_blocks: int):
        self._ttl = ttl_seconds
        self._max_blocks = max_blocks
        self._expiry: dict[str, OrderedDict[int, float]] = {}

    def record(self, endpoint_id: str, hashes: list[int], now: float) -> None:
        entries = self._expiry.setdefault(endpoint_id, OrderedDict())
        for block_hash in hashes:
            entries[block_hash] = now + self._ttl
            entries.move_to_end(block_hash)
        # Oldest first, and all share one TTL: the front is what expires next.
        while entries and (len(entries) > self._max_blocks or next(iter(entries.values())) < now):
            entries.popitem(last=False)

    def forget(self, endpoint_id: str, hashes: list[int]) -> None:
        entries = self._expiry.get(endpoint_id)
        if entries:
            for block_hash in hashes:
                entries.pop(block_hash, None)

    def remove(self, endpoint_id: str) -> None:
        self._expiry.pop(endpoint_id, None)

    def holds(self, endpoint_id: str, block_hash: int, now: float) -> bool:
        entries = self._expiry.get(endpoint_id)
        if not entries:
            return False
        expiry = entries.get(block_hash)
        if expiry is None:
            return False
        if expiry < now:
            del entries[block_hash]
            return False
        return True
