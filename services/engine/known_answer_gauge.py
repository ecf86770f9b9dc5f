"""maas_engine_known_answer_failed: a replica that failed its start-up check, for alerting.

Such a replica runs NOT_SERVING for good (server.py) and no router picks it,
so nothing else would page: the Deployment looks up and the requests go to the
other replicas. The gauge lives in the serving process (both backends), not
with the core's metrics (metrics.py), which reach /metrics through the relay.
"""

from prometheus_client import Gauge

KNOWN_ANSWER_FAILED = Gauge(
    "maas_engine_known_answer_failed",
    "1 when this replica failed its start-up known-answer check and serves nothing",
)
