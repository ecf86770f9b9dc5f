"""The core's metrics, served by the serving process's /metrics.

The engine records maas_engine_* where it runs, in the core process; the
core sends their Prometheus text with some step batches (engine_core.py), and the
serving process re-exposes the latest copy through a collector, so one
scrape of the worker's metrics port still sees every engine series. OpenMetrics
text, because it keeps a counter's family (and its _created) whole.
"""

from prometheus_client import REGISTRY
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

PREFIX = "maas_engine_"


class _EngineFamilies:
    def collect(self):
        return (family for family in REGISTRY.collect() if family.name.startswith(PREFIX))


def engine_metrics_text() -> bytes:
    return generate_latest(_EngineFamilies())


class RelayedMetrics:
    """A collector serving the latest text the core sent."""

    def __init__(self):
        self.text = ""

    def describe(self):
        # The series are the core's, known only once it has sent them.
        return []

    def update(self, text: bytes) -> None:
        self.text = text.decode()

    def collect(self):
        return text_string_to_metric_families(self.text) if self.text else []
