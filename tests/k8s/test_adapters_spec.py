"""spec.adapters (issue #34): the CRD's rules, the refusals, what the pods and routes get."""

import json

import kubernetes_validate
import pytest
import yaml

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.adapter_spec import adapter_refusal, lora_modules
from maas_operator.modeldeployment.crd_schema import ENGINE_LORA_DEFAULTS
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.routes import fragment
from maas_operator.modeldeployment.validation import validate
from maas_services.common.settings import parse_settings
from maas_services.engine.settings import EngineSettings
from maas_services.gateway.routing.routing_table import RoutingTable
from tests.k8s.written_objects import KUBERNETES_VERSION

OWNER = {"metadata": {"name": "smol", "namespace": "ns", "uid": "u-1"}}
SOURCE = {"uri": "pvc://model-store/SmolLM2-135M-Instruct"}


def adapter(name: str, uri: str = "", **fields) -> dict:
    return {"name": name, "source": {"uri": uri or f"pvc://model-store/adapters/{name}"}, **fields}


def md(**spec) -> dict:
    return {"apiVersion": "maas.io/v1alpha1", "kind": "ModelDeployment", "spec": spec}


def with_adapters(*adapters, **spec) -> dict:
    return {"model": {"source": SOURCE}, "adapters": list(adapters), **spec}


def pod(spec: dict) -> dict:
    deployment = resources.deployment(OWNER, defaulted_spec(spec), "maas:1", 1)
    return deployment["spec"]["template"]["spec"]


def engine_settings(container: dict, lora_modules: str | None, monkeypatch) -> EngineSettings:
    """The engine's settings from its args and, as the kubelet resolves it, its
    MAAS_LORA_MODULES (None: the ConfigMap is missing; the reference is optional)."""
    if lora_modules is not None:
        monkeypatch.setenv("MAAS_LORA_MODULES", lora_modules)
    return parse_settings(EngineSettings, container["args"][1:], prog="maas serve engine")


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            with_adapters(adapter("sql"), engine={"maxLoras": 0}),
            "spec: adapters need engine.maxLoras above 0 (0 serves no adapters)",
        ),
        (
            with_adapters(adapter("sql"), engine={"maxCpuLoras": 2}),
            "spec.engine: maxCpuLoras counts the adapters in use too: at least maxLoras",
        ),
        (
            with_adapters(
                *(adapter(f"a{i}") for i in range(3)), engine={"maxLoras": 2, "maxCpuLoras": 2}
            ),
            "spec: more preload adapters than engine.maxCpuLoras: an engine could not hold "
            "them all",
        ),
        (
            {**with_adapters(), "engine": {"backend": "vllm", "maxLoraRank": 24}},
            "spec.engine: vLLM takes a maxLoraRank of 1, 8, 16, 32, 64, 128, 256, 320, 512",
        ),
    ],
)
def test_the_crd_refuses_limits_that_cannot_hold_the_adapters(spec, error):
    spec.setdefault("resources", {"gpus": 1})
    assert validate(md(**spec)) == [error]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (adapter("SQL_upper"), "spec.adapters[0].name"),
        (adapter("sql", "https://example.com/sql.tar.gz"), "spec.adapters[0].source.uri"),
        (adapter("sql", "s3://bucket/sql/"), "spec.adapters[0].source.uri"),
        ({"name": "sql"}, "spec.adapters[0]"),
        (adapter("sql", load="lazy"), "spec.adapters[0].load"),
    ],
)
def test_the_crd_refuses_a_bad_adapter_naming_its_field(bad, field):
    errors = validate(md(**with_adapters(bad)))
    assert errors and all(e.startswith(field) for e in errors), errors


def test_the_most_adapters_a_spec_may_declare_is_64():
    on_demand = [adapter(f"a{i}", load="on-demand") for i in range(64)]
    assert validate(md(**with_adapters(*on_demand))) == []
    errors = validate(md(**with_adapters(*on_demand, adapter("one-more", load="on-demand"))))
    assert errors and errors[0].startswith("spec.adapters: ") and "is too long" in errors[0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            with_adapters(adapter("smol")),
            "spec.adapters[0].name 'smol' is the model's id of this ModelDeployment",
        ),
        (
            with_adapters(adapter("sql"), adapter("chat"), aliases=["chat"]),
            "spec.adapters[1].name 'chat' is an alias of this ModelDeployment",
        ),
        (
            with_adapters(adapter("sql"), adapter("sql", load="on-demand")),
            "spec.adapters[1].name 'sql' is given twice",
        ),
    ],
)
def test_names_that_would_mean_two_things_are_refused_before_anything_runs(spec, message):
    refusal = adapter_refusal("smol", defaulted_spec(spec))
    assert refusal.reason == "AdapterNameConflict" and refusal.message.startswith(message)


def test_another_model_id_frees_the_resource_name_for_an_adapter():
    spec = with_adapters(adapter("smol"), model={"name": "smollm2", "source": SOURCE})
    assert adapter_refusal("smol", defaulted_spec(spec)) is None


def test_no_adapters_change_nothing_in_the_pod():
    (engine,) = pod({"model": {"source": SOURCE}})["containers"]
    assert not [a for a in engine["args"] if "lora" in a]
    assert "MAAS_LORA_MODULES" not in {e["name"] for e in engine["env"]}


def test_preload_adapters_reach_the_engine_through_the_configmap_it_reads_at_start(monkeypatch):
    spec = with_adapters(
        adapter("sql"),
        adapter("chat", "file:///opt/adapters/chat", load="on-demand", tenants=["acme"]),
        adapter("tone", "pvc://lora-store/tone"),
        engine={"maxLoras": 4, "maxLoraRank": 32},
    )
    modules = lora_modules(defaulted_spec(spec))
    assert modules == ["sql=/models/model-store/adapters/sql", "tone=/models/lora-store/tone"]
    deployment = resources.deployment(OWNER, defaulted_spec(spec), "maas:1", 1)
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    template = deployment["spec"]["template"]["spec"]
    (engine,) = template["containers"]
    (ref,) = [e for e in engine["env"] if e["name"] == "MAAS_LORA_MODULES"]
    assert ref["valueFrom"]["configMapKeyRef"] == {
        "name": "maas-engine-adapters",
        "key": "smol",
        "optional": True,
    }
    # What publish() writes under that key, as the engine reads it.
    settings = engine_settings(engine, json.dumps(modules), monkeypatch)
    assert settings.lora_module_sources == {
        "sql": "/models/model-store/adapters/sql",
        "tone": "/models/lora-store/tone",
    }
    assert (settings.max_loras, settings.max_lora_rank, settings.max_cpu_loras) == (4, 32, 32)
    # The model's claim serves the adapters on it; another claim is mounted beside it.
    volumes = {v["name"]: v for v in template["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    assert volumes[mounts["/models/model-store"]]["persistentVolumeClaim"]["claimName"] == (
        "model-store"
    )
    claim = volumes[mounts["/models/lora-store"]]["persistentVolumeClaim"]
    assert claim == {"claimName": "lora-store", "readOnly": True}


def test_a_change_of_adapters_on_mounted_claims_leaves_the_pod_template_as_it_was():
    before = with_adapters(adapter("sql"))
    after = with_adapters(
        adapter("sql"), adapter("chat", "file:///opt/adapters/chat"), adapter("tone")
    )
    assert pod(before) == pod(after), "a new pod template would restart every replica"


def test_a_replica_started_without_the_configmap_still_starts(monkeypatch):
    (engine,) = pod(with_adapters(adapter("sql")))["containers"]
    monkeypatch.delenv("MAAS_LORA_MODULES", raising=False)
    assert engine_settings(engine, None, monkeypatch).lora_modules == []


def test_vllm_gets_lora_on_with_the_native_engines_limits_and_runtime_loading():
    spec = with_adapters(
        adapter("sql"),
        engine={"backend": "vllm", "maxLoraRank": 64},
        resources={"gpus": 1},
    )
    containers = {c["name"]: c for c in pod(spec)["containers"]}
    vllm = containers["vllm"]
    assert vllm["args"][-4:] == [
        "--enable-lora",
        "--max-loras=8",
        "--max-lora-rank=64",
        "--max-cpu-loras=32",
    ]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert not [a for a in vllm["args"] if a.startswith("--lora-modules")]
    # The adapter container reads the preload list and loads it through vLLM's API.
    assert "MAAS_LORA_MODULES" in {e["name"] for e in containers["engine"]["env"]}
    # Both containers see the adapters' claim.
    for container in containers.values():
        assert "/models/model-store" in {m["mountPath"] for m in container["volumeMounts"]}

    plain = {c["name"]: c for c in pod({**spec, "adapters": []})["containers"]}["vllm"]
    assert not [a for a in plain["args"] if "lora" in a]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in {e["name"] for e in plain["env"]}


def test_the_routes_fragment_lists_each_adapter_on_the_main_deployment():
    spec = defaulted_spec(
        with_adapters(
            adapter("sql"),
            adapter("chat", "file:///opt/adapters/chat", load="on-demand", tenants=["acme"]),
            model={"name": "smollm2", "source": SOURCE},
            aliases=["small"],
            canary={"version": "v2", "weight": 10},
        )
    )
    routes = fragment("smol", spec)
    assert routes["adapters"] == {
        "sql": {
            "deployment": "smollm2",
            "source": "/models/model-store/adapters/sql",
            "load": "preload",
        },
        "chat": {
            "deployment": "smollm2",
            "source": "/opt/adapters/chat",
            "load": "on-demand",
            "tenants": ["acme"],
        },
    }
    # What the gateway loads: the fragment is a routing table of its own.
    table = RoutingTable.from_yaml(yaml.safe_dump(routes))
    assert table.adapters["chat"].visible_to("acme") and not table.adapters["chat"].visible_to("b")
    assert table.adapters["sql"].visible_to("anyone")
    assert "adapters" not in fragment("smol", defaulted_spec({}))


def test_the_lora_defaults_the_crd_states_and_vllm_gets_are_the_engines():
    settings = EngineSettings.model_fields
    assert {
        "maxLoras": settings["max_loras"].default,
        "maxLoraRank": settings["max_lora_rank"].default,
        "maxCpuLoras": settings["max_cpu_loras"].default,
    } == ENGINE_LORA_DEFAULTS
