"""Typed views of a (defaulted) ModelDeployment spec."""

from maas_operator.modeldeployment.defaults import defaulted_spec
from maas_operator.modeldeployment.policy import AutoscalingConfig
from maas_services.common import model_claims
from maas_services.common.canary import canary_deployment


def autoscaling_config(spec: dict) -> AutoscalingConfig:
    spec = defaulted_spec(spec)
    bounds, scaling = spec["replicas"], spec["autoscaling"]
    return AutoscalingConfig(
        min_replicas=bounds["min"],
        max_replicas=bounds["max"],
        queue_capacity_per_replica=scaling["queueCapacityPerReplica"],
        prewarm_watermark=scaling["prewarmWatermark"],
        scale_out_watermark=scaling["scaleOutWatermark"],
        scale_in_watermark=scaling["scaleInWatermark"],
        stabilization_seconds=scaling["stabilizationSeconds"],
        cooldown_seconds=scaling["cooldownSeconds"],
        scale_to_zero_after_seconds=scaling["scaleToZeroAfterSeconds"],
    )


def drain_timeout_seconds(spec: dict) -> float:
    return defaulted_spec(spec)["autoscaling"]["drainTimeoutSeconds"]


def model_id(name: str, spec: dict) -> str:
    """The id clients and the router use; the resource name unless spec says otherwise."""
    return model_claims.model_id(name, spec)


def canary_model_id(name: str, spec: dict) -> str:
    """The canary's own deployment (router pool, price, routes): `<model>-canary`."""
    return canary_deployment(model_id(name, spec))


def track_model_id(name: str, spec: dict, track: str) -> str:
    return canary_model_id(name, spec) if track == "canary" else model_id(name, spec)
