"""What the operator builds from a spec: engine flags, model volumes, owned objects."""

import pytest

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.drain import (
    DrainState,
    DrainStep,
    Replica,
    choose_victim,
    next_step,
)
from maas_operator.modeldeployment.engine_args import quantity_bytes
from maas_operator.modeldeployment.model_source import model_mount
from maas_operator.modeldeployment.reconcile import owned_objects
from maas_services.common.settings import parse_settings
from maas_services.engine.settings import EngineSettings

OWNER = {"metadata": {"name": "m", "namespace": "ns", "uid": "u-1"}}


def container(spec: dict) -> dict:
    deployment = resources.deployment(OWNER, defaulted_spec(spec), "img:1", 2)
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_default_spec_runs_the_bundled_model_with_safe_flags():
    args = container({})["args"]
    assert args[0] == "engine"  # after the image's `maas serve` entrypoint
    assert "--model-id=m" in args and "--dtype=auto" in args
    assert not [a for a in args if a.startswith(("--model-path", "--quantization", "--spec"))]


def test_engine_fields_become_flags():
    args = container(
        {
            "engine": {
                "kvCacheMemory": "8Gi",
                "maxModelLen": 4096,
                "quantization": "int8",
                "speculative": {"method": "ngram", "numTokens": 3},
                "extraArgs": ["--torch-threads=4"],
            }
        }
    )["args"]
    assert f"--kv-cache-memory={8 * 2**30}" in args
    assert "--max-model-len=4096" in args and "--quantization=int8" in args
    assert "--speculative-method=ngram" in args and "--num-speculative-tokens=3" in args
    assert args[-1] == "--torch-threads=4"


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9)])
def test_quantities(text, value):
    assert quantity_bytes(text) == value


def test_model_sources():
    assert model_mount({}).model_path == ""
    assert model_mount({"uri": "file:///models/x.gguf"}).model_path == "/models/x.gguf"
    pvc = model_mount({"uri": "pvc://store/qwen/7b"})
    assert pvc.model_path == "/models/store/qwen/7b"
    assert pvc.volumes[0]["persistentVolumeClaim"] == {"claimName": "store", "readOnly": True}
    http = model_mount({"uri": "https://h/m.tar.gz"})
    assert http.model_path == "/models/model"
    script = http.init_containers[0]["command"][2]
    assert "tar -xzf -" in script and "https://" not in script  # the URL goes in via env
    s3 = model_mount({"uri": "s3://b/models/x/", "credentialsSecret": "aws"})
    (fetch,) = s3.init_containers
    assert (
        "--recursive" in fetch["command"][2] and fetch["envFrom"][0]["secretRef"]["name"] == "aws"
    )


def test_gpus_resources_and_placement():
    c = container({"resources": {"gpus": 1, "requests": {"cpu": "4"}, "nodeSelector": {"a": "b"}}})
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["requests"] == {"cpu": "4", "nvidia.com/gpu": "1"}
    deployment = resources.deployment(
        OWNER, defaulted_spec({"resources": {"nodeSelector": {"a": "b"}}}), "i", 1
    )
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"a": "b"}


def test_rollouts_surge_and_grace_covers_the_drain():
    spec = defaulted_spec({"autoscaling": {"drainTimeoutSeconds": 100}})
    deployment = resources.deployment(OWNER, spec, "i", 1)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 100
    assert "--shutdown-grace-seconds=100" in pod["containers"][0]["args"]


def test_owned_objects_point_at_their_owner():
    spec = defaulted_spec({})
    for obj in (
        resources.deployment(OWNER, spec, "i", 1),
        resources.service(OWNER, spec),
        resources.pod_disruption_budget(OWNER, spec),
    ):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == "u-1" and ref["controller"] is True


def test_canary_only_with_a_version_and_weight():
    assert not resources.canary_wanted(defaulted_spec({"canary": {"weight": 10}}))
    spec = defaulted_spec({"canary": {"version": "v2", "weight": 10, "image": "img:2"}})
    assert resources.canary_wanted(spec)
    canary = resources.deployment(OWNER, spec, "img:1", 1, track="canary")
    assert canary["metadata"]["name"] == "m-engine-canary"
    assert canary["spec"]["template"]["spec"]["containers"][0]["image"] == "img:2"
    assert canary["spec"]["selector"]["matchLabels"][resources.TRACK_LABEL] == "canary"


def test_the_canary_is_a_deployment_of_its_own_with_its_own_service():
    spec = defaulted_spec({"model": {"name": "x"}, "canary": {"version": "v2", "weight": 10}})
    canary = resources.deployment(OWNER, spec, "i", 1, track="canary")
    (engine,) = canary["spec"]["template"]["spec"]["containers"]
    assert "--model-id=x-canary" in engine["args"]
    main, own = resources.service(OWNER, spec), resources.service(OWNER, spec, "canary")
    assert own["metadata"]["name"] == "m-engine-canary"
    # The router keys its pools by this label: two pools, two selectors.
    assert (
        main["metadata"]["labels"]["maas.io/model"],
        own["metadata"]["labels"]["maas.io/model"],
    ) == ("x", "x-canary")
    assert own["spec"]["selector"] == canary["spec"]["selector"]["matchLabels"]
    assert main["spec"]["selector"][resources.TRACK_LABEL] == "main"


def test_only_the_main_deployment_leaves_its_replicas_to_the_autoscaler():
    spec = defaulted_spec({"canary": {"version": "v2", "weight": 10}})
    objects = owned_objects(OWNER, spec, "i", 3)
    autoscaled = [obj["metadata"]["name"] for obj, mine in objects if mine]
    assert autoscaled == ["m-engine"]
    assert resources.replicas_only(OWNER, 3) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "m-engine", "namespace": OWNER["metadata"]["namespace"]},
        "spec": {"replicas": 3},
    }


def replica(name, busy=0, ready=True, draining=False):
    return Replica(name, f"{name}:1", ready, draining, busy, 0, 0)


def test_drain_victim_is_the_idlest_serving_replica():
    pool = [
        replica("a", 3),
        replica("b", 1),
        replica("c", 0, ready=False),
        replica("d", 0, draining=True),
    ]
    assert choose_victim(pool).endpoint_id == "b"
    assert choose_victim([replica("x", ready=False)]) is None


def test_drain_steps():
    drain = DrainState("a", "a:1", "pod-a", started_at=100.0)
    assert next_step(drain, [replica("a", 2)], 150.0, 60) is DrainStep.WAIT
    assert next_step(drain, [replica("a", 0)], 150.0, 60) is DrainStep.REMOVE
    assert next_step(drain, [replica("a", 2)], 160.0, 60) is DrainStep.TIMED_OUT
    assert next_step(drain, [], 150.0, 60) is DrainStep.GONE


def test_engine_accepts_every_flag_the_operator_passes_by_default():
    spec = {"engine": {"kvCacheMemory": "1Gi", "maxModelLen": 2048}, "model": {"name": "x"}}
    args = container(spec)["args"]
    settings = parse_settings(EngineSettings, args[1:], prog="maas serve engine")
    assert settings.kv_cache_memory == 2**30 and settings.max_model_len == 2048
    assert settings.model_id == "x" and settings.host == "0.0.0.0"


def test_engine_accepts_the_operators_draft_model_flags():
    speculative = {"method": "draft", "numTokens": 6, "draftModel": "/models/draft"}
    spec = {"engine": {"speculative": speculative}, "model": {"name": "x"}}
    settings = parse_settings(EngineSettings, container(spec)["args"][1:], prog="maas serve engine")
    assert settings.speculative_method == "draft" and settings.num_speculative_tokens == 6
    assert settings.speculative_draft_model == "/models/draft"


def test_engines_demand_the_service_token_of_their_namespace_secret():
    spec = defaulted_spec({"canary": {"version": "v2", "weight": 10}})
    for track in ("main", "canary"):
        deployment = resources.deployment(OWNER, spec, "i", 1, track, token_secret="auth")
        (engine,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in engine["env"]}
        ref = {"secretKeyRef": {"name": "auth", "key": "service-token"}}
        assert env["MAAS_SERVICE_TOKEN"]["valueFrom"] == ref
    assert "MAAS_SERVICE_TOKEN" not in {e["name"] for e in container(spec)["env"]}
