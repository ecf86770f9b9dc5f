"""Fill schema defaults the way the API server does, for code paths without one.

The operator receives objects the API server already defaulted; the
simulator and the validation tests do not, so both go through here.
"""

import copy
from typing import Any

from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA


def apply_defaults(value: Any, schema: dict) -> Any:
    """A copy of value with every absent property that has a default filled in.

    As the API server does: a null where the schema allows none reads as the
    default, or as absent when there is no default; maps and lists are
    defaulted inside too. tests/k8s/test_defaulting.py holds this to a port of
    the server's own algorithm.
    """
    if isinstance(value, dict) and isinstance(schema, dict):
        properties = schema.get("properties", {})
        result = {}
        for name, item in value.items():
            prop = properties.get(name) or schema.get("additionalProperties")
            if not isinstance(prop, dict):  # an unknown field kept as it came
                result[name] = item
                continue
            if item is None and not prop.get("nullable"):
                if "default" not in prop:
                    continue
                item = copy.deepcopy(prop["default"])
            result[name] = apply_defaults(item, prop)
        for name, prop in properties.items():
            if name not in result and "default" in prop:
                result[name] = apply_defaults(copy.deepcopy(prop["default"]), prop)
        return result
    if isinstance(value, list):
        return [apply_defaults(item, schema.get("items", {})) for item in value]
    return value


def defaulted_spec(spec: dict | None) -> dict:
    return apply_defaults(spec or {}, OPENAPI_SCHEMA["properties"]["spec"])
