"""`maas operator simulate`: the command ops run on a trace before applying watermarks."""

import csv
import io
from pathlib import Path

import pytest

from maas_operator.modeldeployment.simulate import COLUMNS
from maas_tools.cli import main as maas

ROOT = Path(__file__).resolve().parents[2]
BURST = ROOT / "deploy" / "examples" / "burst-trace.csv"


def run(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        maas(["operator", "simulate", *args])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_burst_with_crd_defaults(capsys):
    out = run(capsys, "--trace", str(BURST), "--format", "csv", "--startup-delay", "30")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == COLUMNS
    assert len(rows) == len(BURST.read_text().splitlines()) - 1
    desired = [int(r["desired_replicas"]) for r in rows]
    assert desired[0] == 1 and max(desired) == 4 and desired[-1] == 1  # default min 1, max 4
    # Replicas asked for at the rise are ready 30 s later, not at once.
    first_out = next(i for i, r in enumerate(rows) if r["action"] == "scale-out")
    assert int(rows[first_out + 1]["ready_replicas"]) < desired[first_out]
    # Scaling in is one replica at a time.
    assert all(b >= a - 1 for a, b in zip(desired, desired[1:], strict=False))


def test_spec_changes_the_outcome(capsys, tmp_path):
    spec = tmp_path / "md.yaml"
    spec.write_text(
        "apiVersion: maas.io/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        "spec:\n  replicas: {min: 2, max: 10}\n  autoscaling: {queueCapacityPerReplica: 16}\n"
    )
    out = run(capsys, "--trace", str(BURST), "--spec", str(spec), "--format", "csv")
    desired = [int(r["desired_replicas"]) for r in csv.DictReader(io.StringIO(out))]
    assert min(desired) == 2 and 4 < max(desired) <= 10  # beyond the default max of 4


def test_table_format_lines_up(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,queue_depth\n0,0\n10,40\n")
    lines = run(capsys, "--trace", str(trace)).splitlines()
    assert lines[0].split() == COLUMNS
    assert lines[2].split() == ["10", "40", "1", "3", "1.25", "scale-out", "0", "-"]
    assert len({len(line) for line in lines}) == 1


def test_invalid_spec_is_refused_with_the_field(capsys, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        "apiVersion: maas.io/v1alpha1\nkind: ModelDeployment\nspec: {replicas: {min: 3, max: 1}}\n"
    )
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,queue_depth\n0,0\n")
    with pytest.raises(SystemExit) as exit_info:
        maas(["operator", "simulate", "--trace", str(trace), "--spec", str(spec)])
    assert exit_info.value.code == 2
    assert "spec.replicas: min must not exceed max" in capsys.readouterr().err


def test_trace_without_the_columns_is_refused(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("t,q\n0,0\n")
    with pytest.raises(SystemExit):
        maas(["operator", "simulate", "--trace", str(trace)])
    assert "time_s,queue_depth" in capsys.readouterr().err


def test_idle_trace_ends_at_zero_and_the_next_request_is_held_for_the_cold_start(capsys, tmp_path):
    spec = tmp_path / "md.yaml"
    spec.write_text(
        "apiVersion: maas.io/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        "spec: {replicas: {min: 0, max: 2}, autoscaling: {scaleToZeroAfterSeconds: 60}}\n"
    )
    # Busy for a minute, idle for three, then one request that waits in the queue.
    depths = [3] * 6 + [0] * 18 + [1] * 6
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "time_s,queue_depth\n" + "".join(f"{i * 10},{d}\n" for i, d in enumerate(depths))
    )
    out = run(capsys, "--trace", str(trace), "--spec", str(spec), "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    idle = rows[23]
    assert (idle["desired_replicas"], idle["ready_replicas"]) == ("0", "0")
    scaled_in = next(i for i, r in enumerate(rows) if r["action"] == "scale-in")
    assert int(float(rows[scaled_in]["time_s"])) == 60 + 60  # idle from t=60, after 60 s
    arrival = rows[24]
    assert arrival["action"] == "scale-out" and arrival["held"] == "1"
    # min 0 starts at zero too; each replica asked for is ready 30 s later: the hold.
    served = [(float(r["time_s"]), float(r["hold_s"])) for r in rows if r["hold_s"]]
    assert served == [(30.0, 30.0), (270.0, 30.0)]
