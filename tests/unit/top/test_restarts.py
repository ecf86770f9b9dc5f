"""maas top on a local stack shows how often `maas up` restarted each process."""

import json

from rich.console import Console

from maas_tools.top.snapshot import Snapshot
from maas_tools.top.targets import Targets
from maas_tools.top.view import Frame, render


def text(frame: Frame) -> str:
    console = Console(record=True, width=120)
    console.print(render(frame))
    return console.export_text()


def test_restarts_are_read_from_the_state_file_on_every_frame(tmp_path):
    state = {
        "services": {"router": "127.0.0.1:1"},
        "metrics": {},
        "restarts": {"redis": 0, "billing": 1},
    }
    (tmp_path / "stack.json").write_text(json.dumps(state))
    targets = Targets.from_state(tmp_path)
    assert targets.restarts() == {"redis": 0, "billing": 1}
    state["restarts"]["billing"] = 2
    (tmp_path / "stack.json").write_text(json.dumps(state))
    assert targets.restarts()["billing"] == 2

    out = text(Frame(Snapshot(1.0, None, {}, targets.restarts()), None, None, "lifetime"))
    rows = [row.split() for row in out.splitlines()]
    assert ["billing", "2"] in rows and ["redis", "0"] in rows

    (tmp_path / "stack.json").unlink()  # the stack stopped
    assert targets.restarts() == {}


def test_a_cluster_has_no_process_table():
    assert Targets("router:50051").restarts() == {}
    out = text(Frame(Snapshot(1.0, None, {}), None, None, "lifetime"))
    assert "local processes" not in out
