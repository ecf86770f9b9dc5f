"""Placement of the platform's pods: the chart-wide `placement` merged under each
component's own, on every workload the chart runs (and `helm test`'s pod)."""

import kubernetes_validate

from tests.k8s.test_chart import KUBERNETES_VERSION, helm, render_set  # noqa: F401

COMPONENTS = ("gateway", "tokenizer", "router", "billing", "operator", "redis", "postgres")
ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
NODE_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["platform"]}]}
        ]
    }
}
ANTI_AFFINITY = {
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {
            "weight": 100,
            "podAffinityTerm": {
                "topologyKey": HOST,
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "gateway"}},
            },
        }
    ]
}
GLOBAL = (
    "placement.nodeSelector.pool=platform",
    "placement.tolerations[0].key=dedicated",
    "placement.tolerations[0].operator=Equal",
    "placement.tolerations[0].value=platform",
    "placement.tolerations[0].effect=NoSchedule",
    "placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
    "placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].operator=In",
    "placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].values={platform}",
    "placement.topologySpreadConstraints[0].maxSkew=1",
    f"placement.topologySpreadConstraints[0].topologyKey={ZONE}",
    "placement.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
)
GATEWAY = (
    "gateway.placement.nodeSelector.pool=edge",
    "gateway.placement.nodeSelector.arch=amd64",
    "gateway.placement.tolerations[0].key=edge",
    "gateway.placement.tolerations[0].operator=Exists",
    "gateway.placement.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    "[0].weight=100",
    "gateway.placement.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    f"[0].podAffinityTerm.topologyKey={HOST}",
    "gateway.placement.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    "[0].podAffinityTerm.labelSelector.matchLabels.app\\.kubernetes\\.io/component=gateway",
    # The gateway spreads across zones strictly: its constraint replaces the global one.
    "gateway.placement.topologySpreadConstraints[0].maxSkew=1",
    f"gateway.placement.topologySpreadConstraints[0].topologyKey={ZONE}",
    "gateway.placement.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
    "gateway.placement.topologySpreadConstraints[0].minDomains=3",
    "gateway.placement.topologySpreadConstraints[1].maxSkew=1",
    f"gateway.placement.topologySpreadConstraints[1].topologyKey={HOST}",
    "gateway.placement.topologySpreadConstraints[1].whenUnsatisfiable=DoNotSchedule",
)
TOLERATE_PLATFORM = {
    "key": "dedicated",
    "operator": "Equal",
    "value": "platform",
    "effect": "NoSchedule",
}


def pods(docs) -> dict[str, dict]:
    """Each component's pod spec, validated."""
    found = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Pod"):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
            found[doc["metadata"]["name"].removeprefix("maas-")] = spec
    return found


def own_pods(component: str) -> dict:
    return {
        "matchLabels": {
            "app.kubernetes.io/name": "maas",
            "app.kubernetes.io/instance": "maas",
            "app.kubernetes.io/component": component,
        }
    }


def test_no_placement_by_default(helm):  # noqa: F811
    for name, pod in pods(render_set(helm)).items():
        assert not {"nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"} & set(
            pod
        ), name


def test_the_global_placement_reaches_every_platform_pod(helm):  # noqa: F811
    by_name = pods(render_set(helm, *GLOBAL))
    assert set(COMPONENTS) | {"helm-test"} == set(by_name)
    for name, pod in by_name.items():
        assert pod["nodeSelector"] == {"pool": "platform"}, name
        assert pod["tolerations"] == [TOLERATE_PLATFORM], name
        assert pod["affinity"] == {"nodeAffinity": NODE_AFFINITY}, name
        # Without a labelSelector, each component spreads its own pods.
        assert pod["topologySpreadConstraints"] == [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": own_pods(name),
            }
        ], name


def test_a_components_placement_is_merged_over_the_global_one(helm):  # noqa: F811
    by_name = pods(render_set(helm, *GLOBAL, *GATEWAY))
    gateway = by_name["gateway"]
    assert gateway["nodeSelector"] == {"pool": "edge", "arch": "amd64"}
    assert gateway["tolerations"] == [TOLERATE_PLATFORM, {"key": "edge", "operator": "Exists"}]
    assert gateway["affinity"] == {"nodeAffinity": NODE_AFFINITY, "podAntiAffinity": ANTI_AFFINITY}
    assert gateway["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "ScheduleAnyway",
            "minDomains": 3,
            "labelSelector": own_pods("gateway"),
        },
        {
            "maxSkew": 1,
            "topologyKey": HOST,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": own_pods("gateway"),
        },
    ]
    # The others keep the global placement, untouched by the gateway's.
    assert by_name["router"]["nodeSelector"] == {"pool": "platform"}
    assert by_name["router"]["tolerations"] == [TOLERATE_PLATFORM]
    assert by_name["router"]["affinity"] == {"nodeAffinity": NODE_AFFINITY}


def test_each_component_has_its_own_placement(helm):  # noqa: F811
    settings = [f"{c}.placement.nodeSelector.for={c}" for c in COMPONENTS]
    by_name = pods(render_set(helm, *settings))
    for component in COMPONENTS:
        assert by_name[component]["nodeSelector"] == {"for": component}
    assert "nodeSelector" not in by_name["helm-test"]
