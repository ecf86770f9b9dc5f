from maas_services.router.discovery import Routing, Target
from maas_services.router.discovery.kubernetes_objects import snapshot_of


def service(name: str, model: str, **annotations) -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {"maas.io/model": model, "app.kubernetes.io/name": "maas-engine"},
            "annotations": annotations,
        }
    }


def endpoint_slice(name: str, service_name: str, *endpoints: dict, port: int = 50051) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service_name}},
        "ports": [{"name": "metrics", "port": 9090}, {"name": "grpc", "port": port}],
        "endpoints": list(endpoints),
    }


def pod(name: str, ip: str, **conditions) -> dict:
    return {
        "addresses": [ip],
        "conditions": conditions,
        "targetRef": {"kind": "Pod", "name": name},
    }


def test_pods_become_targets_named_after_the_pod_on_the_grpc_port():
    snapshot = snapshot_of(
        [service("demo-engine", "demo")],
        [endpoint_slice("demo-engine-x1", "demo-engine", pod("p0", "10.0.0.5", ready=True))],
    )
    assert snapshot.targets == [Target("p0", "10.0.0.5:50051", "demo", True, False)]


def test_readiness_and_termination_come_from_the_slice_conditions():
    snapshot = snapshot_of(
        [service("demo-engine", "demo")],
        [
            endpoint_slice(
                "s",
                "demo-engine",
                pod("ready", "10.0.0.1", ready=True),
                pod("starting", "10.0.0.2", ready=False),
                pod("leaving", "10.0.0.3", ready=False, serving=True, terminating=True),
                pod("unknown", "10.0.0.4"),
            )
        ],
    )
    states = {t.endpoint_id: (t.ready, t.terminating) for t in snapshot.targets}
    assert states == {
        "ready": (True, False),
        "starting": (False, False),
        "leaving": (False, True),
        "unknown": (True, False),  # an unset condition reads as ready
    }


def test_slices_of_other_services_are_ignored_and_a_pod_in_two_slices_counts_once():
    snapshot = snapshot_of(
        [service("demo-engine", "demo")],
        [
            endpoint_slice("a", "demo-engine", pod("p0", "10.0.0.1", ready=False)),
            endpoint_slice("b", "demo-engine", pod("p0", "10.0.0.1", ready=True)),
            endpoint_slice("c", "billing", pod("other", "10.0.0.9", ready=True)),
        ],
    )
    assert [(t.endpoint_id, t.ready) for t in snapshot.targets] == [("p0", True)]


def test_routing_comes_from_the_service_annotations():
    snapshot = snapshot_of(
        [
            service(
                "demo-engine",
                "demo",
                **{
                    "maas.io/routing-policy": "least-load",
                    "maas.io/routing-weights": '{"requests": 3}',
                },
            ),
            service("plain-engine", "plain"),
            service("broken-engine", "broken", **{"maas.io/routing-weights": "not json"}),
        ],
        [],
    )
    assert snapshot.routing == {
        "demo": Routing("least-load", {"requests": 3.0}),
        "plain": Routing(),
        "broken": Routing(),
    }


def test_ipv6_addresses_are_bracketed():
    snapshot = snapshot_of(
        [service("demo-engine", "demo")],
        [endpoint_slice("s", "demo-engine", pod("p0", "fd00::5", ready=True))],
    )
    assert snapshot.targets[0].address == "[fd00::5]:50051"


def in_namespace(obj: dict, namespace: str) -> dict:
    obj["metadata"]["namespace"] = namespace
    return obj


def test_a_slice_joins_the_service_of_its_own_namespace_only():
    snapshot = snapshot_of(
        [in_namespace(service("demo-engine", "demo"), "a")],
        [
            in_namespace(endpoint_slice("s", "demo-engine", pod("p-a", "10.0.0.1")), "a"),
            in_namespace(endpoint_slice("s", "demo-engine", pod("p-b", "10.0.0.2")), "b"),
        ],
    )
    assert [t.endpoint_id for t in snapshot.targets] == ["p-a"]


def test_only_a_pod_reference_names_the_endpoint():
    node = {"addresses": ["10.0.0.7"], "targetRef": {"kind": "Node", "name": "n1"}}
    snapshot = snapshot_of(
        [service("demo-engine", "demo")], [endpoint_slice("s", "demo-engine", node)]
    )
    assert [t.endpoint_id for t in snapshot.targets] == ["10.0.0.7"]
