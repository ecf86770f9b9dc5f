"""`maas serve engine` takes every flag the operator renders: the adapter's for backend
vllm, and enforceEager's."""

import typing

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA
from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_services.common.settings import parse_settings
from maas_services.engine.settings import EngineSettings


def test_backend_enum_and_default_are_the_engines():
    backend = OPENAPI_SCHEMA["properties"]["spec"]["properties"]["engine"]["properties"]["backend"]
    assert backend["enum"] == list(
        typing.get_args(EngineSettings.model_fields["backend"].annotation)
    )
    assert backend["default"] == EngineSettings.model_fields["backend"].default


def engine_settings(container: dict) -> EngineSettings:
    return parse_settings(EngineSettings, container["args"][1:], prog="maas serve engine")


def test_enforce_eager_is_the_engines_flag():
    owner = {"metadata": {"name": "m", "namespace": "ns", "uid": "u"}}
    spec = defaulted_spec({"engine": {"enforceEager": True}})
    pod = resources.deployment(owner, spec, "maas:1", 1)["spec"]["template"]["spec"]
    assert engine_settings(pod["containers"][0]).enforce_eager is True


def test_the_adapter_accepts_the_operators_flags():
    spec = defaulted_spec(
        {
            "model": {"name": "q", "source": {"uri": "pvc://store/q"}},
            "engine": {"backend": "vllm", "prefixCacheSharing": "global"},
            "resources": {"gpus": 1},
        }
    )
    owner = {"metadata": {"name": "q", "namespace": "ns", "uid": "u"}}
    pod = resources.deployment(owner, spec, "maas:1", 1)["spec"]["template"]["spec"]
    adapter = pod["containers"][0]
    settings = engine_settings(adapter)
    assert (settings.backend, settings.vllm_url) == ("vllm", "http://127.0.0.1:8000")
    assert settings.vllm_kv_events_endpoint == "tcp://127.0.0.1:5557"
    assert settings.model_path == "/models/store/q" and settings.prefix_cache_sharing == "global"
    startup = pod["containers"][1]["startupProbe"]
    assert settings.vllm_startup_timeout == startup["periodSeconds"] * startup["failureThreshold"]
