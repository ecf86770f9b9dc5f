"""`kubectl get modeldeployments` columns read fields the schema declares.

A real API server prunes status fields its schema does not declare, so a column
on an undeclared field would stay empty there while the emulator shows it.
"""

from maas_operator.modeldeployment.crd import crd_manifest
from maas_operator.modeldeployment.crd_schema import OPENAPI_SCHEMA


def declared(json_path: str) -> dict | None:
    schema = OPENAPI_SCHEMA
    for part in json_path.strip(".").split("."):
        if part == "metadata":
            return {"type": "object"}  # the API server's own, always there
        schema = schema.get("properties", {}).get(part)
        if schema is None:
            return None
    return schema


def test_every_column_reads_a_declared_field_of_its_type():
    (version,) = crd_manifest()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    for column in columns.values():
        field = declared(column["jsonPath"])
        assert field is not None, column
        if column["type"] not in ("date", "string"):
            assert field["type"] == column["type"], column
    wanted = {"Ready", "Desired", "Util", "Canary", "ScaledToZero"}
    assert wanted <= set(columns)
    assert columns["Canary"]["jsonPath"] == ".status.canaryWeight"
    assert columns["ScaledToZero"]["jsonPath"] == ".status.scaledToZero"
