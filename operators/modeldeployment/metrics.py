"""Prometheus gauges of what the autoscaler sees and decides, per ModelDeployment."""

from prometheus_client import Counter, Gauge, Histogram

LABELS = ["namespace", "model_deployment"]

QUEUE_DEPTH = Gauge("maas_operator_queue_depth", "Requests waiting in the pool", LABELS)
UTILIZATION = Gauge("maas_operator_utilization", "Queue depth / ready capacity", LABELS)
REPLICAS = Gauge("maas_operator_replicas", "Engine replicas by state", [*LABELS, "state"])
DECISIONS = Counter("maas_operator_decisions", "Autoscaler decisions", [*LABELS, "action"])
# From the tick that asked for a replica at zero to the first that saw it ready.
COLD_START_SECONDS = Histogram(
    "maas_operator_cold_start_seconds",
    "Time from scaling out of zero replicas to a ready replica",
    LABELS,
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200),
)


def record(namespace: str, name: str, status: dict) -> None:
    labels = (namespace, name)
    QUEUE_DEPTH.labels(*labels).set(status["queueDepth"])
    UTILIZATION.labels(*labels).set(status["utilization"])
    REPLICAS.labels(*labels, "desired").set(status["desiredReplicas"])
    REPLICAS.labels(*labels, "ready").set(status["readyReplicas"])
    DECISIONS.labels(*labels, status["lastAction"]).inc()
