"""The cache_salt vLLM is given for each of our request salts, and back.

vLLM 0.32 takes a cache_salt of at most 128 characters without '@', '/',
'\\' or NUL; ours (services/common/block_hash.py request_salt) holds a NUL
and a tenant name of any length. So vLLM gets a digest of it, and the digest
is remembered: vLLM's KV events carry the digest, and translating a root
block into our hash needs the salt itself (kv_translation.py). The book is
bounded; a salt it forgot (or never saw, before an adapter restart) leaves
its blocks out of the router's index until a request brings it back.
"""

import hashlib
from collections import OrderedDict

MAX_SALTS = 65_536


class SaltBook:
    def __init__(self, capacity: int = MAX_SALTS):
        self._capacity = capacity
        self._ours: OrderedDict[str, str] = OrderedDict()

    def vllm_salt(self, salt: str) -> str:
        digest = hashlib.blake2b(salt.encode(), digest_size=16).hexdigest()
        self._ours[digest] = salt
        self._ours.move_to_end(digest)
        if len(self._ours) > self._capacity:
            self._ours.popitem(last=False)
        return digest

    def ours(self, vllm_salt: str) -> str | None:
        return self._ours.get(vllm_salt)
