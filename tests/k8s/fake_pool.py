"""A router and engines on real gRPC, and a kubelet that keeps them in step.

The router answers GetPoolStats from the replicas the fake kubelet started;
each replica is a real engine gRPC server whose Drain marks it draining. The
kubelet plays the Deployment and ReplicaSet controllers over the emulator:
it creates a pod per replica asked for and, when replicas go down, deletes
the pod with the lowest pod-deletion-cost, as the ReplicaSet controller does.
"""

import asyncio
from dataclasses import dataclass, field

import grpc
import kmock

from maas.v1 import engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from maas_operator.modeldeployment.resources import DELETION_COST, OWNER_LABEL, TRACK_LABEL

DEPLOYMENTS = kmock.resource("apps/v1/deployments")
PODS = kmock.resource("v1/pods")


@dataclass
class FakeReplica:
    pod: str
    server: grpc.aio.Server
    address: str
    ready: bool = False
    draining: bool = False
    running: int = 0
    drain_calls: int = 0


class FakeEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self, replica: "FakeReplica"):
        self.replica = replica

    async def Drain(self, request, context):
        self.replica.drain_calls += 1
        self.replica.draining = True
        return engine_pb2.DrainResponse(in_flight=self.replica.running)


class FakeRouter(router_pb2_grpc.RouterServicer):
    def __init__(self, pool: "FakePool"):
        self.pool = pool

    async def GetPoolStats(self, request, context):
        if request.model != self.pool.model:
            return router_pb2.PoolStats()
        replicas = list(self.pool.replicas.values())
        stats = router_pb2.DeploymentStats(
            model=self.pool.model,
            # As the real router: requests held at gateways count in the queue.
            queue_depth=self.pool.queue_depth + self.pool.held,
            held=self.pool.held,
            ready_replicas=sum(r.ready and not r.draining for r in replicas),
            replicas=[
                router_pb2.ReplicaStats(
                    endpoint_id=r.pod,
                    address=r.address,
                    ready=r.ready,
                    draining=r.draining,
                    running=r.running,
                )
                for r in replicas
            ],
        )
        return router_pb2.PoolStats(deployments=[stats])


async def _serve(add, servicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@dataclass
class FakePool:
    emulator: object
    namespace: str
    owner: str  # ModelDeployment name
    model: str
    queue_depth: int = 0
    held: int = 0  # requests gateways report holding (no ready replica)
    # While set, new replicas stay starting (loading weights) and are not ready.
    hold_starting: bool = False
    replicas: dict[str, FakeReplica] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    router_address: str = ""
    _router: grpc.aio.Server | None = None
    _serial: int = 0

    async def start(self) -> None:
        self._router, self.router_address = await _serve(
            router_pb2_grpc.add_RouterServicer_to_server, FakeRouter(self)
        )

    async def stop(self) -> None:
        for replica in self.replicas.values():
            await replica.server.stop(None)
        if self._router:
            await self._router.stop(None)

    def _deployment(self):
        key = (DEPLOYMENTS, self.namespace, f"{self.owner}-engine")
        return (
            None
            if key not in self.emulator.objects or self.emulator.objects[key].deleted
            else (self.emulator.objects[key])
        )

    async def _add_replica(self) -> None:
        self._serial += 1
        pod = f"{self.owner}-engine-{self._serial}"
        replica = FakeReplica(pod, None, "")
        replica.server, replica.address = await _serve(
            engine_pb2_grpc.add_EngineServicer_to_server, FakeEngine(replica)
        )
        self.emulator.objects[PODS, self.namespace, pod] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": self.namespace,
                "labels": {OWNER_LABEL: self.owner, TRACK_LABEL: "main"},
            },
            "status": {"podIP": "127.0.0.1"},
        }
        self.replicas[pod] = replica

    def _deletion_cost(self, pod: str) -> int:
        annotations = self.emulator.objects[PODS, self.namespace, pod]["metadata"].get(
            "annotations", {}
        )
        return int(annotations.get(DELETION_COST, "0"))

    async def _remove_replica(self) -> None:
        pod = min(self.replicas, key=lambda p: (self._deletion_cost(p), -int(p.rsplit("-", 1)[1])))
        replica = self.replicas.pop(pod)
        await replica.server.stop(None)
        del self.emulator.objects[PODS, self.namespace, pod]
        self.removed.append(pod)

    async def sync(self) -> None:
        deployment = self._deployment()
        if deployment is None:
            return
        wanted = deployment["spec"]["replicas"]
        while len(self.replicas) < wanted:
            await self._add_replica()
        while len(self.replicas) > wanted:
            await self._remove_replica()
        if not self.hold_starting:
            for replica in self.replicas.values():
                replica.ready = True
        ready = sum(r.ready for r in self.replicas.values())
        deployment.patch({"status": {"replicas": len(self.replicas), "readyReplicas": ready}})

    async def run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(0.05)
