"""The admission queues: one FairQueue per deployment, sized to its capacity.

A deployment's slots on this replica are its routing-table max_in_flight if
set, else what its ready engines can batch at once (the sum of their
max_num_seqs): beyond that a request would only wait in an engine's queue,
where the gateway cannot order it fairly. With several gateway replicas set
max_in_flight to the capacity divided by the number of replicas.

Each queue has queue_size waiting places, shared by the tenants waiting in
proportion to their tier weights (fair_queue.FairQueue._make_room), so a
tenant flooding one deployment cannot keep the others out of it.
"""

from maas.v1 import router_pb2
from maas_services.gateway.admission.fair_queue import FairQueue
from maas_services.gateway.routing.routing_table import Route


def pool_capacity(stats: router_pb2.DeploymentStats) -> int:
    return sum(r.max_num_seqs for r in stats.replicas if r.ready and not r.draining)


class DeploymentQueues:
    def __init__(self, queue_size: int, queue_timeout: float):
        self._size = queue_size
        self._timeout = queue_timeout
        self._queues: dict[str, FairQueue] = {}

    def queue(self, route: Route, stats: router_pb2.DeploymentStats) -> FairQueue:
        slots = max(route.max_in_flight or pool_capacity(stats), 1)
        queue = self._queues.get(route.deployment)
        if queue is None:
            queue = FairQueue(route.deployment, slots, self._size, self._timeout)
            self._queues[route.deployment] = queue
        elif queue.slots != slots:
            queue.resize(slots)
        return queue
