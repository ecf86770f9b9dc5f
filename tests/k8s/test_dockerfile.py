"""The image and the pods that run it agree (no Docker engine here to build it)."""

import re
import tomllib
from pathlib import Path

from maas_operator.modeldeployment import resources
from maas_operator.modeldeployment.defaults import defaulted_spec

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()


def test_entrypoint_is_maas_serve_and_pods_pass_a_service():
    assert 'ENTRYPOINT ["maas", "serve"]' in DOCKERFILE
    owner = {"metadata": {"name": "m", "namespace": "n", "uid": "u"}}
    deployment = resources.deployment(owner, defaulted_spec({}), "img", 1)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][0] == "engine"


def test_every_copied_path_exists_and_every_package_is_copied():
    copied = re.findall(r"^COPY (?!--from)(\S+(?: \S+)*) \S+$", DOCKERFILE, re.M)
    sources = [s for line in copied for s in line.split()]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    # Every folder the wheel installs from (pyproject's package-dir), and setup.py
    # which lists their packages.
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    folders = {folder.split("/")[0] for folder in package_dir.values()}
    assert folders == {"proto", "services", "tools", "operators", "kernels"}
    assert folders | {"setup.py"} <= set(sources)


def test_cpu_and_cuda_variants_select_the_torch_index():
    assert "ARG VARIANT=cuda" in DOCKERFILE
    assert re.search(r"cuda\) index=\"\$CUDA_INDEX\"", DOCKERFILE)
    assert re.search(r"cpu\) index=\"\$CPU_INDEX\"", DOCKERFILE)
    assert "USER 10001" in DOCKERFILE  # the chart's runAsUser


def test_the_build_stage_prebuilds_the_native_kernels_the_runtime_cannot_compile():
    build, runtime = DOCKERFILE.split("\nFROM python:${PYTHON_VERSION}-slim\n")
    assert "python -m maas_kernels.native.library" in build and " g++" in build
    assert "g++" not in runtime and "libgomp1" in runtime
