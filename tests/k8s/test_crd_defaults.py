"""The CRD, the chart and the Dockerfile default to what the services' settings do.

YAML and a Dockerfile cannot import services/common/defaults.py, so this is
where a number restated there is held to it: a spec or a chart that leaves a
field out must get what `maas serve X` would without the flag.
"""

from pathlib import Path

import pytest
import yaml

from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA
from maas_operator.modeldeployment.settings import OperatorSettings
from maas_services.common import defaults
from maas_services.engine.settings import EngineSettings
from maas_services.gateway.settings import GatewaySettings
from maas_services.router.settings import RouterSettings

ROOT = Path(__file__).resolve().parents[2]
ENGINE_SPEC = OPENAPI_SCHEMA["properties"]["spec"]["properties"]["engine"]["properties"]
VALUES = yaml.safe_load((ROOT / "charts" / "maas" / "values.yaml").read_text())


def default(settings: type, field: str):
    # The declared default, not an instance's: MAAS_* variables must not leak in.
    return settings.model_fields[field].get_default(call_default_factory=True)


@pytest.mark.parametrize(
    ("crd_field", "setting"),
    [
        ("maxNumSeqs", "max_num_seqs"),
        ("maxNumBatchedTokens", "max_num_batched_tokens"),
        ("blockSize", "block_size"),
        ("maxModelLen", "max_model_len"),
        ("gpuMemoryUtilization", "gpu_memory_utilization"),
        ("dtype", "dtype"),
        ("quantization", "quantization"),
        ("prefixCacheSharing", "prefix_cache_sharing"),
        ("backend", "backend"),
    ],
)
def test_crd_engine_defaults_are_the_engines(crd_field, setting):
    assert ENGINE_SPEC[crd_field]["default"] == default(EngineSettings, setting)


def test_crd_speculative_tokens_default_is_the_engines():
    speculative = ENGINE_SPEC["speculative"]["properties"]
    assert speculative["numTokens"]["default"] == default(EngineSettings, "num_speculative_tokens")


def test_crd_block_size_is_the_routers_fallback():
    assert ENGINE_SPEC["blockSize"]["default"] == default(RouterSettings, "block_size")


def test_chart_ports_are_the_services_defaults():
    assert VALUES["gateway"]["httpPort"] == default(GatewaySettings, "port")
    assert VALUES["gateway"]["httpPort"] == defaults.GATEWAY_HTTP_PORT
    assert VALUES["gateway"]["grpcPort"] == defaults.GATEWAY_GRPC_PORT
    assert VALUES["tokenizer"]["grpcPort"] == defaults.TOKENIZER_PORT
    assert VALUES["router"]["grpcPort"] == defaults.ROUTER_PORT
    assert VALUES["billing"]["grpcPort"] == defaults.BILLING_PORT
    assert VALUES["operator"]["healthPort"] == default(OperatorSettings, "port")
    assert VALUES["operator"]["metricsPort"] == default(OperatorSettings, "metrics_port")
    for service in ("gateway", "tokenizer", "router", "billing", "operator"):
        assert VALUES[service]["metricsPort"] == defaults.METRICS_PORT, service


def test_local_addresses_name_the_services_ports():
    tokenizer = default(GatewaySettings, "tokenizer_address")
    assert tokenizer.endswith(f":{defaults.TOKENIZER_PORT}")
    for settings in (GatewaySettings, OperatorSettings):
        assert default(settings, "router_address").endswith(f":{defaults.ROUTER_PORT}")


def test_dockerfile_exposes_every_default_port():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    (expose,) = [line for line in dockerfile.splitlines() if line.startswith("EXPOSE ")]
    ports = {
        defaults.GATEWAY_HTTP_PORT,
        defaults.GATEWAY_GRPC_PORT,
        defaults.TOKENIZER_PORT,
        defaults.ROUTER_PORT,
        defaults.BILLING_PORT,
        defaults.ENGINE_PORT,
        defaults.OPERATOR_HEALTH_PORT,
        defaults.METRICS_PORT,
    }
    assert {int(port) for port in expose.split()[1:]} == ports
