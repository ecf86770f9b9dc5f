"""Every object a client wrote to kmock, checked as a real API server would.

The emulator stores whatever it is sent; the API server checks each write
against Kubernetes' OpenAPI schemas (kubernetes-validate here, strict: an
unknown field is an error) or, for a ModelDeployment, the CRD's schema and CEL
rules. Every version of every object the client created (or applied: a
server-side apply sends the whole object) is checked, including
the versions other writers (the fake kubelet) patched in between.
"""

import json
import re
from functools import cache

import jsonschema
import kmock
from kubernetes_validate.utils import schema_contents
from referencing import Registry, Resource

from maas_operator.modeldeployment.validation import validate as validate_model_deployment

KUBERNETES_VERSION = "1.35.0"  # as tests/k8s/test_chart.py: what the pinned helm speaks
WRITES = ("POST", "PUT", "PATCH")


def _typed(emulator, resource, obj: dict) -> dict:
    """The API server takes a body's apiVersion and kind from its URL when it has none."""
    version = f"{resource.group}/{resource.version}" if resource.group else resource.version
    return {"apiVersion": version, "kind": emulator.resources[resource].kind, **obj}


@cache
def _validator(api_version: str, kind: str) -> jsonschema.Validator:
    """kubernetes-validate's strict schema for a kind, built once: its validate()
    rereads the definitions file on every call, too slow for hundreds of versions."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict"
    schema = schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", KUBERNETES_VERSION)
    definitions = schema_contents(f"{folder}/_definitions.json", KUBERNETES_VERSION)
    registry = Resource.from_contents(schema) @ (Resource.from_contents(definitions) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _problems(obj: dict) -> list[str]:
    if obj.get("kind") == "ModelDeployment":
        return validate_model_deployment(obj)
    errors = _validator(obj["apiVersion"], obj["kind"]).iter_errors(obj)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]


def check_writes(emulator: kmock.KubernetesEmulator, token: str) -> tuple[list[str], set[str]]:
    """Problems found, and the kinds written but not created by this client (only
    patched: their full objects come from elsewhere, so they are not checked)."""
    created, patched = set(), set()
    for request in emulator:
        if request.headers.get("Authorization") != f"Bearer {token}":
            continue
        if request.resource is None or request.method.value not in WRITES:
            continue
        applied = request.headers.get("Content-Type", "").startswith("application/apply-patch")
        if applied:  # the whole object as this client wants it
            created.add((request.resource, request.namespace, request.name))
        elif request.method.value == "POST":
            meta = request.data.get("metadata", {})
            if "name" not in meta:
                continue  # refused before the server named it (generateName): nothing stored
            created.add(
                (request.resource, request.namespace or meta.get("namespace"), meta["name"])
            )
        else:
            patched.add((request.resource, request.namespace, request.name))
    problems, seen = [], set()
    for key in created | patched:
        if key not in emulator.objects:
            continue
        if key[0].plural == "modeldeployments" or key in created:
            for version in emulator.objects[key].history:
                # The fake kubelet rewrites the same status many times a second.
                text = json.dumps(version and version.raw, sort_keys=True)
                if version is None or text in seen:
                    continue
                seen.add(text)
                obj = _typed(emulator, key[0], version.raw)
                problems += [f"{key[0].plural}/{key[2]}: {p}" for p in _problems(obj)]
    unchecked = {key[0].plural for key in patched - created if key[0].plural != "modeldeployments"}
    return problems, unchecked
