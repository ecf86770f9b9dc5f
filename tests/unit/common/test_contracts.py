"""The names in services/common are the ones the router, the engine and the proto implement."""

from maas.v1 import common_pb2
from maas_services.common.finish_reasons import FINISH_CODES, FINISH_NAMES
from maas_services.common.quantization_methods import QUANTIZATION_METHODS
from maas_services.common.routing_policies import (
    DEFAULT_ROUTING_POLICY,
    ROUTING_POLICIES,
    SCORER_NAMES,
)
from maas_services.engine.quantization.config import QuantizationConfig
from maas_services.router.policies import POLICIES, resolve
from maas_services.router.registry import SCORERS


def test_routing_policies_are_the_routers():
    assert set(ROUTING_POLICIES) == set(POLICIES)
    assert DEFAULT_ROUTING_POLICY in ROUTING_POLICIES
    assert resolve("").name == DEFAULT_ROUTING_POLICY


def test_scorer_names_are_the_routers():
    assert set(SCORER_NAMES) == set(SCORERS)


def test_every_quantization_method_is_a_config():
    for method in QUANTIZATION_METHODS:
        assert QuantizationConfig(method=method).method == method


def test_finish_reasons_cover_the_proto_both_ways():
    named = set(common_pb2.FinishReason.values()) - {common_pb2.FINISH_REASON_UNSPECIFIED}
    assert set(FINISH_CODES.values()) == named
    assert all(FINISH_CODES[name] == code for code, name in FINISH_NAMES.items())
