"""Engine Services and their EndpointSlices (plain dicts, as the API serves them)
turned into a discovery Snapshot. Pure, so it is tested without an API server.

The operator gives every ModelDeployment a headless Service labelled with the
model id and annotated with its routing policy; the EndpointSlice controller
lists that Service's pods with ready/terminating conditions. The pod name is
the endpoint id, as it is the engine's --engine-id (MAAS_ENGINE_ID).
"""

import json

from maas_services.common.logging import get_logger
from maas_services.router.discovery import Routing, Snapshot, Target

log = get_logger(__name__)

MODEL_LABEL = "maas.io/model"
POLICY_ANNOTATION = "maas.io/routing-policy"
WEIGHTS_ANNOTATION = "maas.io/routing-weights"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
GRPC_PORT_NAME = "grpc"


def _labels(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("labels") or {}


def routing_of(service: dict) -> Routing:
    annotations = (service.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(WEIGHTS_ANNOTATION) or "{}"
    try:
        weights = {str(k): float(v) for k, v in json.loads(raw).items()}
    except (ValueError, AttributeError, TypeError):
        # A bad annotation must not take routing down: the policy's defaults still work.
        log.warning("bad_routing_weights", service=service["metadata"].get("name"), value=raw)
        weights = {}
    return Routing(policy=annotations.get(POLICY_ANNOTATION, ""), weights=weights)


def _grpc_port(endpoint_slice: dict) -> int | None:
    ports = endpoint_slice.get("ports") or []
    named = [p for p in ports if p.get("name") == GRPC_PORT_NAME]
    chosen = named or ports
    return chosen[0].get("port") if chosen else None


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def targets_of(endpoint_slice: dict, model: str) -> list[Target]:
    port = _grpc_port(endpoint_slice)
    if port is None:
        return []
    targets = []
    for entry in endpoint_slice.get("endpoints") or []:
        addresses = entry.get("addresses") or []
        if not addresses:
            continue
        conditions = entry.get("conditions") or {}
        # The pod's name is the engine's id and what the operator's drain looks up;
        # an endpoint that is no pod's (a hand-made slice) goes by its address.
        ref = entry.get("targetRef") or {}
        name = (ref.get("kind") == "Pod" and ref.get("name")) or addresses[0]
        targets.append(
            Target(
                endpoint_id=name,
                address=_address(addresses[0], port),
                model=model,
                # The API says an unset condition means "unknown, treat as ready".
                ready=conditions.get("ready") is not False,
                terminating=conditions.get("terminating") is True,
            )
        )
    return targets


def _namespace(obj: dict) -> str:
    return obj["metadata"].get("namespace", "")


def snapshot_of(services: list[dict], slices: list[dict]) -> Snapshot:
    """Services and slices of one namespace or several: a slice's Service is in its own."""
    by_name = {
        (_namespace(s), s["metadata"]["name"]): s for s in services if _labels(s).get(MODEL_LABEL)
    }
    targets: dict[str, Target] = {}
    for endpoint_slice in slices:
        service_name = _labels(endpoint_slice).get(SERVICE_NAME_LABEL, "")
        service = by_name.get((_namespace(endpoint_slice), service_name))
        if service is None:
            continue
        for target in targets_of(endpoint_slice, _labels(service)[MODEL_LABEL]):
            # A pod can sit in two slices while the controller rebalances them;
            # the ready copy is the current one.
            known = targets.get(target.endpoint_id)
            if known is None or (target.ready and not known.ready):
                targets[target.endpoint_id] = target
    routing = {_labels(s)[MODEL_LABEL]: routing_of(s) for s in by_name.values()}
    return Snapshot(sorted(targets.values(), key=lambda t: t.endpoint_id), routing)
