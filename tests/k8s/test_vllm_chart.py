"""The chart with the vLLM example: the operator it configures admits the example and
renders it a pod the API server would take."""

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import yaml

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.admission import AdmissionPolicy
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate
from tests.k8s.chart_render import CHART, ROOT, helm_binary, rendered
from tests.k8s.written_objects import KUBERNETES_VERSION

EXAMPLE = ROOT / "deploy" / "examples" / "qwen2.5-7b-vllm-gpu.yaml"


def render(values: dict, tmp_path: Path) -> list[dict]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [helm_binary(), "template", "maas", str(CHART), "-n", "maas", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def operator_env(docs: list[dict]) -> dict[str, str]:
    (operator,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "maas-operator"
    ]
    return {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def test_the_vllm_example_through_the_chart_and_the_operator(tmp_path):
    example = yaml.safe_load(EXAMPLE.read_text())
    # The example as the chart's own ModelDeployment, its image left to the chart's values.
    spec = example["spec"]
    del spec["engine"]["vllm"]["image"]
    values = {
        "engine": {"vllm": {"image": {"repository": "mirror.example.com/vllm", "tag": "v9"}}},
        "exampleModelDeployment": {"name": example["metadata"]["name"], "spec": spec},
    }
    docs = render(values, tmp_path)
    (rendered,) = [d for d in docs if d["kind"] == "ModelDeployment"]
    assert validate(rendered) == []
    env = operator_env(docs)
    assert env["MAAS_VLLM_IMAGE"] == "mirror.example.com/vllm:v9"
    policy = AdmissionPolicy(tuple(json.loads(env["MAAS_ALLOWED_IMAGES"])), ".+")
    # The values' repository at another tag is admitted; another vLLM image is not.
    assert policy.image_allowed("mirror.example.com/vllm:v10")
    assert not policy.image_allowed("vllm/vllm-openai:v0.32.0")
    assert policy.refusal(defaulted_spec(rendered["spec"])) is None

    owner = {**rendered, "metadata": {**rendered["metadata"], "namespace": "maas", "uid": "u"}}
    obj = resources.deployment(
        owner,
        defaulted_spec(rendered["spec"]),
        env["MAAS_ENGINE_IMAGE"],
        1,
        vllm_image=env["MAAS_VLLM_IMAGE"],
    )
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    pod = obj["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == [
        env["MAAS_ENGINE_IMAGE"],
        "mirror.example.com/vllm:v9",
    ]
    assert pod["containers"][1]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["tolerations"] == spec["resources"]["tolerations"]


def test_the_default_values_name_vllms_official_image():
    env = operator_env(rendered("maas"))
    assert env["MAAS_VLLM_IMAGE"].startswith("vllm/vllm-openai:v")
    assert "vllm/vllm-openai:*" in json.loads(env["MAAS_ALLOWED_IMAGES"])
