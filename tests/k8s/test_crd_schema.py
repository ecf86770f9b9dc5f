"""ModelDeployments against the CRD's openAPIV3Schema, and the CRD file's freshness."""

from pathlib import Path

import pytest
import yaml

from maas_operator.modeldeployment.crd import CHART_CRD, crd_manifest, render
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))


def md(**spec) -> dict:
    return {
        "apiVersion": "maas.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m"},
        "spec": spec,
    }


def test_committed_crd_is_what_the_schema_renders():
    assert CHART_CRD.read_text() == render(), "stale CRD: run `make crd`"


def test_crd_has_status_scale_and_printer_columns():
    version = crd_manifest()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.min"
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.name"
    assert {"Ready", "Desired", "Queue", "Util", "Age"} <= set(columns)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path):
    assert validate(yaml.safe_load(path.read_text())) == []


def test_examples_cover_cpu_and_one_gpu_on_each_backend():
    specs = [defaulted_spec(yaml.safe_load(p.read_text())["spec"]) for p in EXAMPLES]
    found = sorted((s["engine"]["backend"], s["resources"]["gpus"]) for s in specs)
    assert found == [("native", 0), ("native", 1), ("vllm", 1)]


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"engine": {"dtype": "int4"}}, "spec.engine.dtype", "is not one of"),
        ({"engine": {"maxNumSeqs": 0}}, "spec.engine.maxNumSeqs", "less than the minimum"),
        ({"engine": {"kvCacheMemory": "8 GB"}}, "spec.engine.kvCacheMemory", "does not match"),
        ({"model": {"source": {"uri": "ftp://x/y"}}}, "spec.model.source.uri", "does not match"),
        ({"replicas": {"min": -1}}, "spec.replicas.min", "less than the minimum"),
        (
            {"autoscaling": {"prewarmWatermark": 1.5}},
            "spec.autoscaling.prewarmWatermark",
            "maximum",
        ),
        ({"canary": {"weight": 101}}, "spec.canary.weight", "maximum"),
        (
            {"resources": {"tolerations": [{"effect": "Sometimes"}]}},
            "spec.resources.tolerations[0].effect",
            "is not one of",
        ),
        ({"routing": {"policy": "random"}}, "spec.routing.policy", "is not one of"),
        ({"engine": {"maxNumSeq": 8}}, "spec.engine", "'maxNumSeq' was unexpected"),
        ({"replicas": {"min": 5, "max": 2}}, "spec.replicas", "min must not exceed max"),
        (
            {"autoscaling": {"scaleInWatermark": 0.7}},
            "spec.autoscaling",
            "scaleInWatermark < prewarmWatermark",
        ),
    ],
)
def test_bad_specs_are_rejected_with_the_path_to_the_field(spec, path, words):
    errors = validate(md(**spec))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{path}: ") and words in errors[0], errors[0]


def test_an_empty_spec_gets_every_default():
    spec = defaulted_spec({})
    assert spec["replicas"] == {"min": 1, "max": 4}
    assert spec["autoscaling"]["prewarmWatermark"] == 0.6
    assert spec["autoscaling"]["scaleOutWatermark"] == 0.9
    assert spec["engine"]["speculative"]["method"] == "none"
    assert validate(md()) == []
