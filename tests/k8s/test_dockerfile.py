"""The image and the pods that run it agree (no Docker engine here to build it)."""

import re
from pathlib import Path

from operators.modeldeployment import resources
from operators.modeldeployment.defaults import defaulted_spec

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
    top_level = {"proto", "services", "operators", "maas_kernels"}
    assert top_level <= set(sources)


def test_cpu_and_cuda_variants_select_the_torch_index():
    assert "ARG VARIANT=cuda" in DOCKERFILE
    assert re.search(r"cuda\) index=\"\$CUDA_INDEX\"", DOCKERFILE)
    assert re.search(r"cpu\) index=\"\$CPU_INDEX\"", DOCKERFILE)
    assert "USER 10001" in DOCKERFILE  # the chart's runAsUser


def test_the_build_stage_prebuilds_the_native_kernels_the_runtime_cannot_compile():
    build, runtime = DOCKERFILE.split("\nFROM python:${PYTHON_VERSION}-slim\n")
    assert "python -m services.engine.native.library" in build and " g++" in build
    assert "g++" not in runtime and "libgomp1" in runtime
