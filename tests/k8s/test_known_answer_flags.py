"""spec.engine.knownAnswerPerplexity reaches both engine backends as --known-answer."""

import pytest

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate
from tests.k8s.test_rendered_engine_flags import engine_settings

OWNER = {"metadata": {"name": "m", "namespace": "ns", "uid": "u"}}
VLLM = {"backend": "vllm", "kvCacheMemory": "1Gi"}
SOURCE = {"source": {"uri": "pvc://models/smol"}}


def engine_container(**engine) -> dict:
    spec = defaulted_spec({"model": SOURCE, "engine": engine})
    pod = resources.deployment(OWNER, spec, "maas:1", 1)["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "engine"]
    return container


@pytest.mark.parametrize("backend", [{}, VLLM])
def test_the_specs_reference_reaches_the_engine(backend):
    settings = engine_settings(engine_container(**backend, knownAnswerPerplexity=8.2875))
    assert float(settings.known_answer) == 8.2875


@pytest.mark.parametrize("backend", [{}, VLLM])
def test_without_one_a_pod_checks_the_sanity_bound(backend):
    # A pod never loads a float32 copy of its model to compute a reference.
    assert engine_settings(engine_container(**backend)).known_answer == "bound"


def test_a_reference_below_one_is_refused():
    spec = {"apiVersion": "maas.io/v1alpha1", "kind": "ModelDeployment"}
    (error,) = validate({**spec, "spec": {"engine": {"knownAnswerPerplexity": 0.5}}})
    assert error.startswith("spec.engine.knownAnswerPerplexity")
