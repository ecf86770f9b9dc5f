"""Check a ModelDeployment against the CRD schema without an API server.

jsonschema checks the OpenAPI part. Two things the API server does that
jsonschema would not are added here: unknown fields are errors (kubectl's
strict field validation), and the CRD's CEL rules (x-kubernetes-validations)
are evaluated by a CEL interpreter (cel-python), on values typed by the schema
as the API server types them: a `number` is a double even when written `1`.
"""

from functools import cache
from typing import Any

import celpy
import jsonschema
from celpy import celtypes

from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA
from maas_operator.modeldeployment.defaults import apply_defaults


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


@cache
def cel_program(rule: str) -> celpy.Runner:
    """A compiled rule; a rule CEL cannot parse raises here, as it fails the CRD's install."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_value(value: Any, schema: dict) -> celtypes.Value:
    """value as the API server hands it to CEL: typed by its schema, not by its JSON."""
    kind = schema.get("type")
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        return celtypes.MapType(
            {
                celtypes.StringType(k): cel_value(v, props.get(k) or extra or {})
                for k, v in value.items()
            }
        )
    if isinstance(value, list):
        return celtypes.ListType([cel_value(v, schema.get("items", {})) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if kind == "number" or isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    return celtypes.StringType(value)


def _rule_error(rule: dict, value: Any, schema: dict) -> str | None:
    try:
        passed = cel_program(rule["rule"]).evaluate({"self": cel_value(value, schema)})
    except celpy.CELEvalError as exc:
        return f"rule {rule['rule']!r} failed to evaluate: {exc.args[0]}"
    return None if passed else rule["message"]


def _cel_errors(value: Any, schema: dict, path: list) -> list[str]:
    errors = [
        f"{_path(path)}: {message}"
        for rule in schema.get("x-kubernetes-validations", [])
        if (message := _rule_error(rule, value, schema))
    ]
    if isinstance(value, dict):
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
