"""Workloads for `maas bench`, one per file, by name."""

from maas_tools.bench.scenarios.chat import Chat
from maas_tools.bench.scenarios.concurrency import Concurrency
from maas_tools.bench.scenarios.long_prefill_mix import LongPrefillMix
from maas_tools.bench.scenarios.rate import Rate
from maas_tools.bench.scenarios.shared_prefix import SharedPrefix
from maas_tools.bench.scenarios.uniform_random import UniformRandom

SCENARIOS: dict[str, type] = {
    s.name: s for s in (SharedPrefix, UniformRandom, Rate, Concurrency, Chat, LongPrefillMix)
}
