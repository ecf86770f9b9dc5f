"""The API server's defaulting of a custom resource, as a reference for the
operator's own (operators/modeldeployment/defaults.py).

Ported from k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting
(algorithm.go, prunenulls.go) and kept in their shape on purpose, so that it
can be read against them line by line. On every write and read the server
first drops null values of non-nullable fields that have no default, then
Default(): each property that is absent, or null and not nullable, gets a deep
copy of its default, and defaulting recurses into properties,
additionalProperties and array items, a default just set included.
"""

import copy
from typing import Any


def _is_non_nullable_null(x: Any, s: dict) -> bool:
    return x is None and not s.get("nullable", False)


def prune_non_nullable_nulls_without_defaults(x: Any, s: dict | None) -> None:
    if s is None:
        return
    if isinstance(x, dict):
        properties = s.get("properties", {})
        for k in list(x):
            prop = properties.get(k) or s.get("additionalProperties")
            if isinstance(prop, dict):
                if _is_non_nullable_null(x[k], prop) and "default" not in prop:
                    del x[k]
                else:
                    prune_non_nullable_nulls_without_defaults(x[k], prop)
    elif isinstance(x, list):
        for v in x:
            prune_non_nullable_nulls_without_defaults(v, s.get("items"))


def default(x: Any, s: dict | None) -> None:
    if s is None:
        return
    if isinstance(x, dict):
        properties = s.get("properties", {})
        for k, prop in properties.items():
            if "default" not in prop:
                continue
            if k not in x or _is_non_nullable_null(x[k], prop):
                x[k] = copy.deepcopy(prop["default"])
        for k, v in x.items():
            if k in properties:
                default(v, properties[k])
            elif isinstance(s.get("additionalProperties"), dict):
                default(v, s["additionalProperties"])
    elif isinstance(x, list):
        for v in x:
            default(v, s.get("items"))


def server_defaulted(obj: Any, schema: dict) -> Any:
    result = copy.deepcopy(obj)
    prune_non_nullable_nulls_without_defaults(result, schema)
    default(result, schema)
    return result
