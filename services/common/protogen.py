"""Generate the protobuf and gRPC modules from proto/maas/v1/*.proto.

The generated files are committed beside their .proto sources so installs do
not need grpcio-tools; a test regenerates into a temporary folder and fails
when the committed copy is stale.
"""

import argparse
import importlib.resources
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[2] / "proto"
PROTO_PACKAGE = Path("maas") / "v1"


def proto_files() -> list[Path]:
    return sorted((PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc into out_root/maas/v1 and return the generated files."""
    from grpc_tools import protoc

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed; see its output above")
    return sorted(
        p for p in (out_root / PROTO_PACKAGE).iterdir() if p.name.endswith((".py", ".pyi"))
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            shutil.copyfile(path, PROTO_ROOT / PROTO_PACKAGE / path.name)
            print(f"wrote {PROTO_PACKAGE / path.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
