"""Pool statistics, for the operator (GetPoolStats) and for dashboards (/metrics).

Sums count only replicas that may take requests, so the operator's capacity and
queue figures never include a replica that is going away. The Prometheus
collector reads the live pool at scrape time, so a replica that left the pool
leaves the metrics with it rather than lingering as a stale series.
"""

import weakref

from prometheus_client.core import REGISTRY, GaugeMetricFamily

from maas.v1 import router_pb2
from maas_services.common.serves import offered
from maas_services.router.endpoints import Endpoint
from maas_services.router.prefix_index import PrefixIndex


def replica_stats(e: Endpoint, index: PrefixIndex) -> router_pb2.ReplicaStats:
    return router_pb2.ReplicaStats(
        endpoint_id=e.endpoint_id,
        address=e.address,
        ready=e.ready,
        draining=e.draining or e.terminating,
        running=e.running,
        waiting=e.waiting,
        in_flight=e.picked_since_poll,
        kv_cache_usage=e.kv_cache_usage,
        max_num_seqs=e.max_num_seqs,
        kv_cache_blocks=e.kv_cache_blocks,
        block_size=e.block_size,
        kv_events_live=e.kv_events_live,
        indexed_blocks=index.size(e.endpoint_id),
        adapters=sorted(e.adapters),
        max_loras=e.max_loras,
    )


def deployment_stats(
    model: str, endpoints: list[Endpoint], index: PrefixIndex, policy: str, held: int = 0
) -> router_pb2.DeploymentStats:
    serving = [e for e in endpoints if e.available]
    return router_pb2.DeploymentStats(
        model=model,
        replicas=[replica_stats(e, index) for e in sorted(endpoints, key=lambda e: e.endpoint_id)],
        # Requests held at the gateways wait for this pool as much as queued ones.
        queue_depth=sum(e.waiting for e in serving) + held,
        held=held,
        ready_replicas=len(serving),
        running=sum(e.running for e in serving),
        in_flight=sum(e.picked_since_poll for e in serving),
        capacity=sum(e.max_num_seqs for e in serving),
        kv_cache_usage=sum(e.kv_cache_usage for e in serving) / len(serving) if serving else 0.0,
        routing_policy=policy,
        # What the gateway may send here: what any ready replica serves.
        serves=sorted(set().union(*(offered(e.serves) for e in serving))),
        adapters=sorted(set().union(*(e.adapters for e in serving))),
    )


class PoolCollector:
    """maas_router_replica_* and maas_router_deployment_* gauges of every live servicer."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet = weakref.WeakSet()

    def collect(self):
        labels = ["model", "endpoint"]
        replica = {
            name: GaugeMetricFamily(f"maas_router_replica_{name}", text, labels=labels)
            for name, text in [
                ("available", "1 when the replica may take new requests"),
                ("requests_running", "Requests running in the engine's batch"),
                ("requests_waiting", "Requests queued in the engine"),
                ("in_flight", "Requests this router picked it for since its last load report"),
                ("kv_cache_usage_ratio", "Fraction of KV blocks in use"),
                ("indexed_blocks", "KV blocks the prefix index holds for it"),
            ]
        }
        deployment = {
            name: GaugeMetricFamily(f"maas_router_deployment_{name}", text, labels=["model"])
            for name, text in [
                ("ready_replicas", "Replicas that may take new requests"),
                ("queue_depth", "Requests queued over ready replicas"),
                ("requests_running", "Requests running over ready replicas"),
                ("capacity", "Batch slots (max_num_seqs) over ready replicas"),
            ]
        }
        for source in list(self.sources):
            for stats in source.pool_stats().deployments:
                for r in stats.replicas:
                    key = [stats.model, r.endpoint_id]
                    replica["available"].add_metric(key, float(r.ready and not r.draining))
                    replica["requests_running"].add_metric(key, r.running)
                    replica["requests_waiting"].add_metric(key, r.waiting)
                    replica["in_flight"].add_metric(key, r.in_flight)
                    replica["kv_cache_usage_ratio"].add_metric(key, r.kv_cache_usage)
                    replica["indexed_blocks"].add_metric(key, r.indexed_blocks)
                deployment["ready_replicas"].add_metric([stats.model], stats.ready_replicas)
                deployment["queue_depth"].add_metric([stats.model], stats.queue_depth)
                deployment["requests_running"].add_metric([stats.model], stats.running)
                deployment["capacity"].add_metric([stats.model], stats.capacity)
        yield from replica.values()
        yield from deployment.values()


COLLECTOR = PoolCollector()
REGISTRY.register(COLLECTOR)
