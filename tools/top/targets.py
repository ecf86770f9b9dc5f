"""Where maas top reads from: a local stack's state file, or a cluster's addresses.

Local mode (`maas up`) writes STATE_DIR/stack.json with every service's
/metrics URL and the router's address. On a cluster the router's pool stats
name every engine replica's address; its /metrics is on the same host at the
engine pods' metrics port. The state file also counts each local child's
restarts (maas up restarts a child that dies); it is read again for every frame.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from maas.v1 import router_pb2


@dataclass
class Targets:
    router_address: str
    gateway_metrics: str = ""
    billing_metrics: str = ""
    # endpoint id -> /metrics URL, for engines whose URL is known up front.
    engine_metrics: dict[str, str] = field(default_factory=dict)
    # Where an engine not listed above serves /metrics (0: don't guess).
    engine_metrics_port: int = 0
    # A local stack's stack.json (None on a cluster, where Kubernetes counts restarts).
    state_file: Path | None = None
    # The router demands the service token: a local stack's, or this process's own (None).
    service_token: str | None = None

    @classmethod
    def from_state(cls, state_dir: Path) -> "Targets":
        state_file = state_dir / "stack.json"
        state = json.loads(state_file.read_text())
        metrics = state["metrics"]
        return cls(
            router_address=state["services"]["router"],
            gateway_metrics=metrics.get("gateway", ""),
            billing_metrics=metrics.get("billing", ""),
            engine_metrics={k: v for k, v in metrics.items() if k.startswith("engine-")},
            state_file=state_file,
            service_token=state.get("service_token"),
        )

    def restarts(self) -> dict[str, int]:
        """Child name -> restarts so far; empty without a readable state file."""
        if self.state_file is None:
            return {}
        try:
            return json.loads(self.state_file.read_text()).get("restarts", {})
        except (OSError, ValueError):
            # Gone (the stack stopped) or caught mid-write: no counts this frame.
            return {}

    def engine_urls(self, pool: router_pb2.PoolStats | None) -> dict[str, str]:
        urls = dict(self.engine_metrics)
        for deployment in pool.deployments if pool else ():
            for replica in deployment.replicas:
                if replica.endpoint_id not in urls and self.engine_metrics_port:
                    host = urlsplit(f"//{replica.address}").hostname
                    urls[replica.endpoint_id] = f"http://{host}:{self.engine_metrics_port}/metrics"
        return urls
