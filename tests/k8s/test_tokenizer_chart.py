"""The chart hands the tokenizer its deployments' tokenizers and the volume they are on."""

import kubernetes_validate

from maas_services.tokenizer.settings import TokenizerSettings, TokenizerSource
from tests.k8s.test_chart import KUBERNETES_VERSION, helm, render_refused, render_set  # noqa: F401

QWEN = "/models/qwen/Qwen2.5-7B-Instruct"


def tokenizer_pod(docs) -> dict:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "maas-tokenizer"
    ]
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    return deployment["spec"]["template"]["spec"]


def test_models_reach_the_service_with_their_volume(helm, monkeypatch):  # noqa: F811
    pod = tokenizer_pod(
        render_set(
            helm,
            f"tokenizer.models.qwen2-5-7b-instruct.path={QWEN}",
            "tokenizer.models.qwen2-5-7b-instruct.max_model_len=32768",
            "tokenizer.maxResident=2",
            "tokenizer.volumes[0].name=models",
            "tokenizer.volumes[0].persistentVolumeClaim.claimName=qwen",
            "tokenizer.volumeMounts[0].name=models",
            "tokenizer.volumeMounts[0].mountPath=/models/qwen",
        )
    )
    (container,) = pod["containers"]
    for entry in container["env"]:
        monkeypatch.setenv(entry["name"], entry.get("value", ""))
    settings = TokenizerSettings()  # as the pod's process reads its environment
    assert settings.tokenizer_models == {
        "qwen2-5-7b-instruct": TokenizerSource(path=QWEN, max_model_len=32768)
    }
    assert settings.max_resident_tokenizers == 2
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "qwen"}} in pod["volumes"]
    assert {"name": "models", "mountPath": "/models/qwen"} in container["volumeMounts"]


def test_by_default_one_model_and_no_extra_volume(helm):  # noqa: F811
    pod = tokenizer_pod(render_set(helm))
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["MAAS_TOKENIZER_MODELS"] == "{}"
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


def test_a_model_without_a_path_is_refused(helm):  # noqa: F811
    assert "path" in render_refused(helm, "tokenizer.models.qwen.max_model_len=5")
