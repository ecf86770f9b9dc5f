"""Check a ModelDeployment against the CRD schema without an API server.

jsonschema checks the OpenAPI part. Two things the API server does that
jsonschema would not are added here: unknown fields are errors (kubectl's
strict field validation), and the CRD's CEL rules are evaluated by Python
twins, one per rule; a rule without a twin is a programming error.
"""

from collections.abc import Callable
from typing import Any

import jsonschema

from operators.modeldeployment.crd_schema import OPENAPI_SCHEMA
from operators.modeldeployment.defaults import apply_defaults

CEL_TWINS: dict[str, Callable[[dict], bool]] = {
    "self.min <= self.max": lambda o: o["min"] <= o["max"],
    "self.scaleInWatermark < self.prewarmWatermark && "
    "self.prewarmWatermark <= self.scaleOutWatermark": lambda o: (
        o["scaleInWatermark"] < o["prewarmWatermark"] <= o["scaleOutWatermark"]
    ),
}


def _strict(schema: Any) -> Any:
    """The schema with unknown properties forbidden wherever fields are declared."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


_VALIDATOR = jsonschema.Draft202012Validator(
    _strict(OPENAPI_SCHEMA), format_checker=jsonschema.FormatChecker()
)


def _path(parts) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"


def _cel_errors(value: Any, schema: dict, path: list) -> list[str]:
    if not isinstance(value, dict):
        return []
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        if not CEL_TWINS[rule["rule"]](value):
            errors.append(f"{_path(path)}: {rule['message']}")
    for name, prop in schema.get("properties", {}).items():
        if name in value:
            errors += _cel_errors(value[name], prop, [*path, name])
    return errors


def validate(obj: dict) -> list[str]:
    """Every problem as 'path.to.field: message'; empty when the object is valid."""
    errors = [
        f"{_path(error.absolute_path)}: {error.message}"
        for error in sorted(_VALIDATOR.iter_errors(obj), key=lambda e: list(e.absolute_path))
    ]
    if errors:
        return errors
    # CEL runs on the defaulted object, as it does in the API server.
    return _cel_errors(apply_defaults(obj, OPENAPI_SCHEMA), OPENAPI_SCHEMA, [])
