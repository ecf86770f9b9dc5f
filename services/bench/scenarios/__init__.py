"""Workloads for `maas bench`, one per file, by name."""

from services.bench.scenarios.chat import Chat
from services.bench.scenarios.concurrency import Concurrency
from services.bench.scenarios.long_prefill_mix import LongPrefillMix
from services.bench.scenarios.rate import Rate
from services.bench.scenarios.shared_prefix import SharedPrefix
from services.bench.scenarios.uniform_random import UniformRandom

SCENARIOS: dict[str, type] = {
    s.name: s for s in (SharedPrefix, UniformRandom, Rate, Concurrency, Chat, LongPrefillMix)
}
