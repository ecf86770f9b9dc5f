"""The tree's rules (docs/layout.md): a service imports only itself and common,
and nothing under services/ imports the tools."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "tokenizer", "router", "engine", "billing")


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service_and_no_tool(service):
    others = [f"maas_services.{s}" for s in SERVICES if s != service] + ["maas_tools"]
    crossing = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "services" / service).rglob("*.py")
        for name in imported(path)
        if any(name == o or name.startswith(o + ".") for o in others)
    )
    assert not crossing, crossing


def test_common_imports_no_service():
    crossing = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "services" / "common").rglob("*.py")
        for name in imported(path)
        if any(name.startswith(f"maas_services.{s}") for s in SERVICES)
        or name.startswith("maas_tools")
    )
    assert not crossing, crossing
