"""The committed generated code must be what `make proto` produces now."""

from pathlib import Path

from maas_services.common.protogen import PROTO_PACKAGE, PROTO_ROOT, generate


def test_generated_code_is_fresh(tmp_path: Path):
    generated = generate(tmp_path)
    assert generated, "protoc produced nothing"
    stale = [
        path.name
        for path in generated
        if not (PROTO_ROOT / PROTO_PACKAGE / path.name).is_file()
        or (PROTO_ROOT / PROTO_PACKAGE / path.name).read_bytes() != path.read_bytes()
    ]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"
    committed = {p.name for p in (PROTO_ROOT / PROTO_PACKAGE).glob("*_pb2*.py*")}
    assert committed == {p.name for p in generated}, "generated files without a .proto"
