"""`maas conformance` as a user runs it: the table on stdout, the exit code."""

import pytest

from maas_tools.cli import main as maas
from tests.unit.conformance.fake_server import Defects, serve


@pytest.mark.parametrize(("defects", "code"), [(Defects(), 0), (Defects(usage_unasked=True), 1)])
def test_the_command_prints_a_table_and_exits_by_what_failed(defects, code, capsys):
    with serve(defects) as base_url, pytest.raises(SystemExit) as done:
        maas(["conformance", base_url, "--only", "streaming", "--only", "models"])
    table = capsys.readouterr().out
    assert done.value.code == code
    rows = {line.split()[0]: line.split()[1] for line in table.splitlines()[1:-1]}
    assert rows == {
        "models.list": "pass",
        "models.retrieve": "pass",
        "streaming.chunk_shape": "pass",
        "streaming.usage_chunk": "fail" if code else "pass",
    }
