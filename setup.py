"""The package list, which pyproject.toml cannot derive when folders and
import names differ (its package-dir table maps them): every package under
each mapped folder, named under its import name. Namespace packages too:
folders of data (tools/eval/data) are then packages whose files
package-data names, as setuptools asks."""

from setuptools import find_namespace_packages, setup

ROOTS = {
    "maas": "proto/maas",
    "maas_services": "services",
    "maas_tools": "tools",
    "maas_operator": "operators",
    "maas_kernels": "kernels",
}

setup(
    packages=[
        name
        for top, folder in ROOTS.items()
        for name in [top, *(f"{top}.{sub}" for sub in find_namespace_packages(folder))]
        if "__pycache__" not in name
    ]
)
