"""Where maas top reads from: a local stack's state file, or a cluster's addresses.

Local mode (`maas up`) writes STATE_DIR/stack.json with every service's
/metrics URL and the router's address. On a cluster the router's pool stats
name every engine replica's address; its /metrics is on the same host at the
engine pods' metrics port.
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

    @classmethod
    def from_state(cls, state_dir: Path) -> "Targets":
        state = json.loads((state_dir / "stack.json").read_text())
        metrics = state["metrics"]
        return cls(
            router_address=state["services"]["router"],
            gateway_metrics=metrics.get("gateway", ""),
            billing_metrics=metrics.get("billing", ""),
            engine_metrics={k: v for k, v in metrics.items() if k.startswith("engine-")},
        )

    def engine_urls(self, pool: router_pb2.PoolStats | None) -> dict[str, str]:
        urls = dict(self.engine_metrics)
        for deployment in pool.deployments if pool else ():
            for replica in deployment.replicas:
                if replica.endpoint_id not in urls and self.engine_metrics_port:
                    host = urlsplit(f"//{replica.address}").hostname
                    urls[replica.endpoint_id] = f"http://{host}:{self.engine_metrics_port}/metrics"
        return urls
