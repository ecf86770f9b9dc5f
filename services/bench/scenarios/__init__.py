"""Workloads for `maas bench`, one per file, by name."""

from services.bench.scenarios.shared_prefix import SharedPrefix
from services.bench.scenarios.uniform_random import UniformRandom

SCENARIOS: dict[str, type] = {s.name: s for s in (SharedPrefix, UniformRandom)}
