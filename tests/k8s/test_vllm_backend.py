"""spec.engine.backend vllm: the CRD's rules, the pod the operator renders, the allow-list."""

import json

import kubernetes_validate
import pytest

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.admission import AdmissionPolicy
from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate
from tests.k8s.written_objects import KUBERNETES_VERSION

OWNER = {"metadata": {"name": "qwen", "namespace": "ns", "uid": "u-1"}}
SOURCE = {"uri": "pvc://model-store/Qwen2.5-7B-Instruct"}
MODEL_PATH = "/models/model-store/Qwen2.5-7B-Instruct"


def md(**spec) -> dict:
    return {"apiVersion": "maas.io/v1alpha1", "kind": "ModelDeployment", "spec": spec}


def vllm_spec(**engine) -> dict:
    return {
        "model": {"name": "qwen2.5-7b", "source": SOURCE},
        "engine": {"backend": "vllm", **engine},
        "resources": {"gpus": 1, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
    }


def deployment(spec: dict, **kw) -> dict:
    return resources.deployment(OWNER, defaulted_spec(spec), "maas:1", 1, **kw)


def containers(spec: dict, **kw) -> dict[str, dict]:
    pod = deployment(spec, **kw)["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def test_native_is_the_default_and_vllm_a_backend():
    backend = OPENAPI_SCHEMA["properties"]["spec"]["properties"]["engine"]["properties"]["backend"]
    assert backend["enum"] == ["native", "vllm"] and backend["default"] == "native"
    assert defaulted_spec({})["engine"]["backend"] == "native"
    assert validate(md(**vllm_spec())) == []
    (error,) = validate(md(engine={"backend": "sglang"}))
    assert error.startswith("spec.engine.backend: ")


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {"engine": {"backend": "vllm", "kvCacheMemory": "2Gi"}},
            "spec: backend vllm needs model.source.uri",
        ),
        (
            {"engine": {"backend": "vllm"}, "model": {"source": SOURCE}},
            "spec: backend vllm on CPU needs engine.kvCacheMemory",
        ),
        (
            vllm_spec(quantization="int8"),
            "spec.engine: quantization and speculative are the native engine's",
        ),
        (vllm_spec(speculative={"method": "ngram"}), "spec.engine: quantization and speculative"),
        (vllm_spec(vllm={"args": "--foo"}), "spec.engine.vllm.args: '--foo' is not of type"),
        (vllm_spec(vllm={"port": 9000}), "spec.engine.vllm: Additional properties"),
        ({"engine": {"enforceEager": "yes"}}, "spec.engine.enforceEager: 'yes' is not of type"),
    ],
)
def test_specs_a_vllm_pod_could_not_run_are_refused(spec, error):
    (found,) = validate(md(**spec))
    assert found.startswith(error), found


def test_the_pod_is_the_adapter_on_the_engine_ports_beside_vllm():
    spec = vllm_spec(
        maxModelLen=16384,
        enforceEager=True,
        kvCacheMemory="20Gi",
        extraArgs=["--log-level=debug"],
        vllm={"args": ["--max-lora-rank=16"], "env": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}},
    )
    found = containers(spec, vllm_image="vllm/vllm-openai:v1")
    assert list(found) == ["engine", "vllm"]
    adapter, server = found["engine"], found["vllm"]

    # What the router, gateway and autoscaler talk to is unchanged: gRPC probes and ports.
    assert adapter["image"] == "maas:1"
    assert [p["containerPort"] for p in adapter["ports"]] == [50051, 9090]
    assert adapter["readinessProbe"]["grpc"] == {"port": 50051}
    assert adapter["args"][0] == "engine"
    assert {
        "--backend=vllm",
        "--vllm-url=http://127.0.0.1:8000",
        "--vllm-kv-events-endpoint=tcp://127.0.0.1:5557",
        f"--model-path={MODEL_PATH}",
        "--model-id=qwen2.5-7b",
        "--max-num-seqs=64",
    } <= set(adapter["args"])
    assert "--max-num-seqs=64" in server["args"]
    assert adapter["args"][-1] == "--log-level=debug"  # engine.extraArgs go to the adapter
    # The adapter waits for vLLM as long as the kubelet does.
    startup = server["startupProbe"]
    seconds = startup["periodSeconds"] * startup["failureThreshold"]
    assert f"--vllm-startup-timeout={seconds}" in adapter["args"]

    assert server["image"] == "vllm/vllm-openai:v1"
    args = server["args"]
    assert server["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert args[:4] == [
        f"--model={MODEL_PATH}",
        "--served-model-name=qwen2.5-7b",
        "--host=0.0.0.0",
        "--port=8000",
    ]
    (events,) = [a.split("=", 1)[1] for a in args if a.startswith("--kv-events-config=")]
    assert json.loads(events) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "topic": "kv-events",
    }
    assert {"--enable-prompt-tokens-details", "--enforce-eager", "--max-model-len=16384"} <= set(
        args
    )
    assert f"--kv-cache-memory-bytes={20 * 2**30}" in args
    assert args[-1] == "--max-lora-rank=16" and "--tensor-parallel-size=1" not in args
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "vllm-http"}
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER" and "VLLM_CPU_KVCACHE_SPACE" not in env
    # The GPU is vLLM's; the adapter asks for a little CPU only.
    assert server["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "nvidia.com/gpu" not in json.dumps(adapter["resources"])


def test_the_vllm_pod_has_a_read_only_root_and_writable_emptydirs_and_validates():
    obj = deployment(vllm_spec(), vllm_image="vllm/vllm-openai:v1")
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    pod = obj["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    for container in pod["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        for path in ("/tmp", "/var/cache/maas"):
            assert "emptyDir" in volumes[mounts[path]], (container["name"], path)
        # Both read the same weights: vLLM serves them, the adapter checks the tokenizer.
        assert volumes[mounts["/models/model-store"]]["persistentVolumeClaim"]["readOnly"]
    env = {e["name"]: e["value"] for e in pod["containers"][1]["env"]}
    assert env["HOME"] == "/tmp" and env["XDG_CACHE_HOME"] == "/var/cache/maas"
    # vLLM outlives the adapter's drain: its preStop waits for the gRPC port to close.
    hook = pod["containers"][1]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["python3", "-c"] and hook[-1] == "50051"


def test_vllm_on_cpu_gets_its_kv_cache_in_gib_and_many_gpus_tensor_parallel():
    cpu = vllm_spec(kvCacheMemory="1536Mi")
    cpu["resources"] = {"gpus": 0}
    server = containers(cpu)["vllm"]
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert not [a for a in server["args"] if a.startswith("--kv-cache-memory-bytes")]
    many = vllm_spec()
    many["resources"]["gpus"] = 4
    assert "--tensor-parallel-size=4" in containers(many)["vllm"]["args"]


def test_a_vllm_image_the_allow_list_does_not_name_is_refused():
    policy = AdmissionPolicy(("maas:*", "vllm/vllm-openai:*"), "model-credentials-.+")
    assert policy.refusal(defaulted_spec(vllm_spec(vllm={"image": "vllm/vllm-openai:v2"}))) is None
    found = policy.refusal(defaulted_spec(vllm_spec(vllm={"image": "attacker.example/vllm:1"})))
    assert found.reason == "ImageNotAllowed"
    assert found.message.startswith("spec.engine.vllm.image 'attacker.example/vllm:1' ")


def test_enforce_eager_and_the_cache_dir_reach_the_native_engine():
    (engine,) = containers({"engine": {"enforceEager": True}}).values()
    assert "--enforce-eager" in engine["args"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["MAAS_CACHE_DIR"] == "/var/cache/maas"
    assert {"name": "cache", "mountPath": "/var/cache/maas"} in engine["volumeMounts"]
    (default,) = containers({}).values()
    assert "--enforce-eager" not in default["args"]
