"""One engine replica as the router sees it: where it is, whether it may take
requests, and the load it last reported.

Three sources feed an Endpoint. Discovery says it exists and whether its pod is
ready or terminating. The engine itself (GetLoad polls, the KV event stream)
says whether it answers, whether it drains, and how loaded it is, counting
every router's requests. ``picked_since_poll`` is this router's picks since
the engine's last report, which that report cannot include yet. Nothing else
ends a pick: the engine's next report is when the router learns a request
ended, so a gateway makes no call to the router after its stream. Likewise
``adapters_picked``: adapters this router sent here that the engine may be
loading, counted as loaded until a report asked for after the pick answers.
"""

from dataclasses import dataclass, field

from maas_services.common.block_hash import BLOCK_SIZE


@dataclass
class Endpoint:
    endpoint_id: str
    address: str
    model: str = ""
    # Discovery: the pod passes its readiness probe / is being deleted.
    discovered_ready: bool = True
    terminating: bool = False
    # The engine: its last GetLoad answered and its event stream did not just break.
    reachable: bool = False
    draining: bool = False
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    max_num_seqs: int = 0
    kv_cache_blocks: int = 0
    # How the engine hashes its blocks; the router hashes prompts the same way.
    block_size: int = BLOCK_SIZE
    cache_salt: str = ""
    prefix_cache_sharing: str = "tenant"
    # What the engine serves (LoadReport.serves); empty: an engine from before the field.
    serves: tuple[str, ...] = ()
    # LoRA adapters the engine holds (LoadReport.adapters, and its KV events'
    # ADAPTER_LOADED and _UNLOADED between reports: kv_events.py) and how many it
    # can hold at once (LoadReport.max_loras; 0: it serves none).
    adapters: frozenset[str] = frozenset()
    max_loras: int = 0
    kv_events_live: bool = False
    # This router's picks since the last GetLoad answer: not in its counts yet.
    picked_since_poll: int = 0
    # adapter -> when this router last picked this replica for it (monotonic).
    adapters_picked: dict[str, float] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.reachable and self.discovered_ready

    @property
    def available(self) -> bool:
        """May take new requests: a draining or terminating replica only finishes its own."""
        return self.ready and not self.draining and not self.terminating

    @property
    def requests(self) -> int:
        """Requests at this replica. The engine's count includes other routers' traffic
        but is a poll old, so this router's picks since then are added to it (those
        that ended since are counted until the next poll: a burst spreads)."""
        return self.running + self.waiting + self.picked_since_poll

    def apply_report(self, load, counted: int, asked: float) -> None:
        """Take in a LoadReport asked for at `asked` (monotonic), when this router
        had picked the replica `counted` times since the previous one."""
        self.model = load.model
        self.draining = load.draining
        self.running = load.running
        self.waiting = load.waiting
        self.picked_since_poll -= counted
        self.kv_cache_usage = load.kv_cache_usage
        self.max_num_seqs = load.max_num_seqs
        self.kv_cache_blocks = load.kv_cache_blocks
        # Engines that don't report these use the defaults both sides share.
        self.block_size = load.block_size or self.block_size
        self.cache_salt = load.cache_salt
        self.prefix_cache_sharing = load.prefix_cache_sharing
        self.serves = tuple(load.serves)
        self.adapters = frozenset(load.adapters)
        self.max_loras = load.max_loras
        # The report settles the adapters picked before it was asked for: loaded or not.
        self.adapters_picked = {a: t for a, t in self.adapters_picked.items() if t >= asked}

    @property
    def loaded_adapters(self) -> frozenset[str]:
        """Adapters held here or on their way: a burst for an adapter the replica
        lacked then finds it loaded, instead of loading it on every replica."""
        return self.adapters | self.adapters_picked.keys()

    @property
    def hash_params(self) -> tuple[int, str]:
        # The engine salts with its model id unless told otherwise (--cache-salt).
        return self.block_size, self.cache_salt or self.model


def parse_static(entries: list[str]) -> list[tuple[str, str]]:
    """(id, address) pairs from `id=host:port` or bare `host:port` (the address is the id)."""
    pairs, seen = [], set()
    for entry in entries:
        endpoint_id, sep, address = entry.partition("=")
        if not sep:
            endpoint_id, address = entry, entry
        if not address or ":" not in address:
            raise ValueError(f"engine endpoint {entry!r} is not ID=HOST:PORT or HOST:PORT")
        if endpoint_id in seen:
            raise ValueError(f"engine endpoint id {endpoint_id!r} appears twice")
        seen.add(endpoint_id)
        pairs.append((endpoint_id, address))
    return pairs
