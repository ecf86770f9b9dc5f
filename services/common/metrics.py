"""Prometheus metrics: the /metrics port and the gRPC metrics every service shares.

Names follow ``maas_<service>_<what>_<unit>``; each process runs exactly one
service, so the service name is part of the metric name, not a label.
"""

from dataclasses import dataclass
from functools import cache

from prometheus_client import Counter, Histogram, start_http_server

# Quarter-millisecond steps to 2 ms: fine enough to tell a gateway's added
# latency (its target is under 2 ms) from the engine's own.
LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.00125,
    0.0015,
    0.00175,
    0.002,
    0.0025,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


def start_metrics_server(host: str, port: int) -> int:
    """Serve /metrics on its own port; returns the bound port (port 0 picks one)."""
    server, _thread = start_http_server(port, addr=host)
    return server.server_port


@dataclass(frozen=True)
class GrpcMetrics:
    handled: Counter
    latency: Histogram


@cache
def grpc_metrics(service: str, side: str) -> GrpcMetrics:
    """Per-process gRPC metrics for one side ("server" or "client")."""
    prefix = f"maas_{service}_grpc_{side}"
    labels = ["grpc_service", "grpc_method", "grpc_code"]
    return GrpcMetrics(
        handled=Counter(f"{prefix}_handled", f"gRPC calls completed on the {side} side", labels),
        latency=Histogram(
            f"{prefix}_handling_seconds",
            f"gRPC call duration on the {side} side, to the last message",
            labels,
            buckets=LATENCY_BUCKETS,
        ),
    )
