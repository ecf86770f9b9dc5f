"""One Prometheus /metrics page, parsed into samples that maas top can sum and slice."""

from collections import defaultdict
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class Metrics:
    def __init__(self, text: str):
        self._samples: dict[str, list[Sample]] = defaultdict(list)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self._samples[sample.name].append(Sample(sample.labels, sample.value))

    def _matching(self, name: str, match: dict[str, str]) -> list[Sample]:
        return [
            s
            for s in self._samples.get(name, ())
            if all(s.labels.get(k) == v for k, v in match.items())
        ]

    def total(self, name: str, **match: str) -> float:
        return sum(s.value for s in self._matching(name, match))

    def by_label(self, name: str, label: str, **match: str) -> dict[str, float]:
        sums: dict[str, float] = defaultdict(float)
        for s in self._matching(name, match):
            sums[s.labels.get(label, "")] += s.value
        return dict(sums)

    def buckets(self, histogram: str, **match: str) -> dict[float, float]:
        """Cumulative counts by upper bound, summed over every matching series."""
        counts: dict[float, float] = defaultdict(float)
        for s in self._matching(f"{histogram}_bucket", match):
            counts[float(s.labels["le"])] += s.value
        return dict(counts)


async def scrape(http: httpx.AsyncClient, url: str) -> Metrics | None:
    """None when the page cannot be read: a replica that is down is shown, not fatal."""
    try:
        reply = await http.get(url)
        reply.raise_for_status()
    except httpx.HTTPError:
        return None
    return Metrics(reply.text)
