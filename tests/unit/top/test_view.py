"""What maas top shows, from two snapshots of made-up pages."""

from rich.console import Console

from maas.v1 import router_pb2
from maas_tools.top.scrape import Metrics
from maas_tools.top.snapshot import ENGINE, Snapshot
from maas_tools.top.targets import Targets
from maas_tools.top.view import Frame, render


def engine_page(tokens: int, ttft_fast: int, ttft_slow: int) -> Metrics:
    return Metrics(
        f"""# TYPE maas_engine_generation_tokens counter
maas_engine_generation_tokens_total {tokens}
# TYPE maas_engine_time_to_first_token_seconds histogram
maas_engine_time_to_first_token_seconds_bucket{{le="0.1"}} {ttft_fast}
maas_engine_time_to_first_token_seconds_bucket{{le="1.0"}} {ttft_fast + ttft_slow}
maas_engine_time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft_fast + ttft_slow}
"""
    )


def billing_page(requests: int, prompt: int, completion: int) -> Metrics:
    return Metrics(
        f"""# TYPE maas_billing_tenant_requests counter
maas_billing_tenant_requests_total{{tenant="acme"}} {requests}
# TYPE maas_billing_tenant_tokens counter
maas_billing_tenant_tokens_total{{tenant="acme",kind="prompt"}} {prompt}
maas_billing_tenant_tokens_total{{tenant="acme",kind="completion"}} {completion}
"""
    )


POOL = router_pb2.PoolStats(
    deployments=[
        router_pb2.DeploymentStats(
            model="smol",
            ready_replicas=1,
            queue_depth=3,
            running=2,
            capacity=64,
            kv_cache_usage=0.25,
            routing_policy="prefix_affinity",
            replicas=[
                router_pb2.ReplicaStats(
                    endpoint_id="engine-0", ready=True, waiting=3, running=2, kv_cache_usage=0.25
                ),
                router_pb2.ReplicaStats(endpoint_id="engine-1", draining=True),
            ],
        )
    ]
)


def text(frame: Frame) -> str:
    console = Console(record=True, width=120)
    console.print(render(frame))
    return console.export_text()


def line(output: str, starting: str) -> list[str]:
    (found,) = [row.split() for row in output.splitlines() if row.startswith(starting)]
    return found


def test_rates_come_from_the_difference_between_two_snapshots():
    before = Snapshot(10.0, POOL, {ENGINE + "engine-0": engine_page(100, 0, 0)})
    before.pages["billing"] = billing_page(1, 10, 5)
    now = Snapshot(12.0, POOL, {ENGINE + "engine-0": engine_page(140, 3, 1)})
    now.pages["billing"] = billing_page(3, 30, 25)
    out = text(Frame(now, before, before, "the last 2s"))
    # queue, running, KV from the router; tokens/s and TTFT from the engine's page.
    assert line(out, "engine-0") == ["engine-0", "ready", "3", "2", "25%", "20.0", "67ms", "964ms"]
    assert line(out, "engine-1")[1:4] == ["draining,", "no", "/metrics"]
    assert line(out, "smol") == ["smol", "1/2", "3", "2", "64", "25%", "prefix_affinity"]
    assert line(out, "acme") == ["acme", "3", "1.0", "30", "25", "20.0"]
    assert "rates over the last 2.0s" in out


def test_the_first_frame_has_no_rates_and_says_where_things_are_missing():
    now = Snapshot(1.0, None, {"gateway": None})
    out = text(Frame(now, None, None, "each process's lifetime"))
    assert "no rates until the next frame" in out
    assert line(out, "router unreachable")[2:] == ["-"] * 6
    assert line(out, "unreachable") == ["unreachable"] + ["-"] * 5
    assert line(out, "no --billing-metrics")[2:] == ["-"] * 5


def test_a_cluster_finds_engine_metrics_at_the_replicas_hosts():
    targets = Targets("router:50051", engine_metrics_port=9090)
    pool = router_pb2.PoolStats(
        deployments=[
            router_pb2.DeploymentStats(
                replicas=[router_pb2.ReplicaStats(endpoint_id="pod-a", address="10.0.0.7:50051")]
            )
        ]
    )
    assert targets.engine_urls(pool) == {"pod-a": "http://10.0.0.7:9090/metrics"}
    assert Targets("router:50051").engine_urls(pool) == {}
