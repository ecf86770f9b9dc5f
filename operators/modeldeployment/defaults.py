"""Fill schema defaults the way the API server does, for code paths without one.

The operator receives objects the API server already defaulted; the
simulator and the validation tests do not, so both go through here.
"""

import copy
from typing import Any

from operators.modeldeployment.crd_schema import OPENAPI_SCHEMA


def apply_defaults(value: Any, schema: dict) -> Any:
    """A copy of value with every absent property that has a default filled in."""
    if schema.get("type") == "object" and isinstance(value, dict):
        result = dict(value)
        for name, prop in schema.get("properties", {}).items():
            if name not in result and "default" in prop:
                result[name] = copy.deepcopy(prop["default"])
            if name in result:
                result[name] = apply_defaults(result[name], prop)
        return result
    if schema.get("type") == "array" and isinstance(value, list):
        return [apply_defaults(item, schema.get("items", {})) for item in value]
    return value


def defaulted_spec(spec: dict | None) -> dict:
    return apply_defaults(spec or {}, OPENAPI_SCHEMA["properties"]["spec"])
