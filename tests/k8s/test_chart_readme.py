"""The chart's README is generated from values.schema.json (charts/maas/readme.py):
the committed file is what the generator writes, and every value has the
description the README shows."""

import json
import runpy

from tests.k8s.test_chart import CHART

GENERATOR = runpy.run_path(str(CHART / "readme.py"))


def test_the_committed_readme_is_the_generated_one():
    assert (CHART / "README.md").read_text() == GENERATOR["render"](), (
        "charts/maas/README.md is stale: run `make chart-readme`"
    )


def test_every_value_in_the_schema_is_described():
    schema = json.loads((CHART / "values.schema.json").read_text())
    missing = []

    def walk(properties: dict, prefix: str) -> None:
        for name, node in properties.items():
            if not node.get("description"):
                missing.append(f"{prefix}{name}")
            walk(node.get("properties", {}), f"{prefix}{name}.")

    walk(schema["properties"], "")
    for name, definition in schema.get("definitions", {}).items():
        walk(definition["properties"], f"definitions.{name}.")
    assert missing == []
