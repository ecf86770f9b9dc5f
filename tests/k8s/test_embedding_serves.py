"""ModelDeployment spec.serves: what the engines serve, as `--serves` to each engine
(the native one, or the vLLM adapter with vLLM's pooling runner), checked by the schema."""

import pytest

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate
from maas_services.common.serves import DEFAULT_SERVES
from tests.k8s.test_rendered_engine_flags import engine_settings
from tests.k8s.test_vllm_backend import md, vllm_spec

OWNER = {"metadata": {"name": "m", "namespace": "ns", "uid": "u"}}


def containers(spec: dict) -> dict[str, dict]:
    pod = resources.deployment(OWNER, defaulted_spec(spec), "maas:1", 1)
    return {c["name"]: c for c in pod["spec"]["template"]["spec"]["containers"]}


def test_without_serves_each_engine_serves_its_backends_default():
    native = containers({})["engine"]
    assert not any(a.startswith("--serves") for a in native["args"])
    assert engine_settings(native).served == DEFAULT_SERVES["native"] == ["generate", "embed"]
    vllm = containers(vllm_spec())
    assert engine_settings(vllm["engine"]).served == DEFAULT_SERVES["vllm"] == ["generate"]
    assert "--runner=pooling" not in vllm["vllm"]["args"]


@pytest.mark.parametrize("serves", [["embed"], ["generate"], ["generate", "embed"]])
def test_a_native_deployment_passes_its_serves_to_the_engine(serves):
    assert validate(md(serves=serves)) == []
    engine = containers({"serves": serves})["engine"]
    assert f"--serves={','.join(serves)}" in engine["args"]
    assert engine_settings(engine).served == serves


def test_a_vllm_embedding_deployment_runs_vllms_pooling_runner():
    spec = {**vllm_spec(), "serves": ["embed"]}
    assert validate(md(**spec)) == []
    pod = containers(spec)
    assert engine_settings(pod["engine"]).served == ["embed"]
    args = pod["vllm"]["args"]
    assert "--runner=pooling" in args and "--convert=embed" in args


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {**vllm_spec(), "serves": ["generate", "embed"]},
            "spec: a vLLM server runs its generation runner or its pooling runner, not both",
        ),
        ({"serves": []}, "spec.serves: [] should be non-empty"),
        ({"serves": ["classify"]}, "spec.serves[0]: 'classify' is not one of"),
        ({"serves": "embed"}, "spec.serves: 'embed' is not of type 'array'"),
    ],
)
def test_serves_a_deployment_could_not_run_is_refused(spec, error):
    (found,) = validate(md(**spec))
    assert found.startswith(error), found
