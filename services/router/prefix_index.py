"""Which KV blocks each replica holds, exactly as its engine's KV events say.

Block hashes are chained (services/common/block_hash.py), so holding a block's
hash means holding that whole prefix. Stored/evicted/cleared events keep each
replica's set exact; every router subscribes itself, so each router replica
builds the same index from the same events and none holds the only copy.
"""


class PrefixIndex:
    def __init__(self) -> None:
        self._blocks: dict[str, set[int]] = {}

    def stored(self, endpoint_id: str, hashes: list[int]) -> None:
        self._blocks.setdefault(endpoint_id, set()).update(hashes)

    def evicted(self, endpoint_id: str, hashes: list[int]) -> None:
        self._blocks.get(endpoint_id, set()).difference_update(hashes)

    def clear(self, endpoint_id: str) -> None:
        self._blocks.pop(endpoint_id, None)

    def holds(self, endpoint_id: str, block_hash: int) -> bool:
        return block_hash in self._blocks.get(endpoint_id, ())

    def size(self, endpoint_id: str) -> int:
        return len(self._blocks.get(endpoint_id, ()))
