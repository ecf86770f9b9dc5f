"""Rendezvous (highest-random-weight) hashing over endpoint ids.

Every router replica computes the same ranking from the same key with no shared
state, and removing one endpoint only moves the keys that ranked it first.
blake2b, not hash(): Python salts hash() per process.
"""

import hashlib


def weight(key: bytes, endpoint_id: str) -> int:
    digest = hashlib.blake2b(key + b"\x00" + endpoint_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
