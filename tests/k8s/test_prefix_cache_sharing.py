"""spec.engine.prefixCacheSharing: validated by the CRD schema, rendered into engine flags."""

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.validation import validate
from maas_services.common.settings import parse_settings
from maas_services.engine.settings import EngineSettings

OWNER = {"metadata": {"name": "m", "namespace": "ns", "uid": "u-1"}}


def engine_settings(spec: dict) -> EngineSettings:
    deployment = resources.deployment(OWNER, defaulted_spec(spec), "img:1", 1)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return parse_settings(EngineSettings, args[1:], prog="maas serve engine")


def md(engine: dict) -> dict:
    return {
        "apiVersion": "maas.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m"},
        "spec": {"engine": engine},
    }


def test_isolation_is_the_default():
    assert defaulted_spec({})["engine"]["prefixCacheSharing"] == "tenant"
    assert engine_settings({}).prefix_cache_sharing == "tenant"


def test_global_sharing_reaches_the_engine():
    assert validate(md({"prefixCacheSharing": "global"})) == []
    spec = {"engine": {"prefixCacheSharing": "global"}}
    assert engine_settings(spec).prefix_cache_sharing == "global"


def test_an_unknown_mode_is_rejected():
    errors = validate(md({"prefixCacheSharing": "public"}))
    assert len(errors) == 1 and errors[0].startswith("spec.engine.prefixCacheSharing: ")
    assert "is not one of" in errors[0]
