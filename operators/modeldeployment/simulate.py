"""`maas operator simulate`: the real policy over a queue-depth trace.

Each trace row is one observation, as one operator tick would see it. A
replica asked for becomes ready `--startup-delay` seconds later (weights
loading); a scale-in removes one ready replica at once, as if its drain
finished before the next row. Ops tune watermarks here before applying them.

With replicas.min 0 a trace that goes idle ends at zero replicas. Requests
that arrive then are held at the gateway (`held`) until a replica is ready;
the row where one is ready says how long the first of them waited (`hold_s`).
"""

import argparse
import csv
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from maas_operator.modeldeployment.policy import (
    Action,
    AutoscalerState,
    AutoscalingConfig,
    Observation,
    decide,
)
from maas_operator.modeldeployment.spec import autoscaling_config
from maas_operator.modeldeployment.validation import validate

COLUMNS = [
    "time_s",
    "queue_depth",
    "ready_replicas",
    "desired_replicas",
    "utilization",
    "action",
    "held",
    "hold_s",
]


@dataclass
class SimulatedPool:
    startup_delay: float
    ready_at: list[float] = field(default_factory=list)  # one entry per replica

    def ready(self, now: float) -> int:
        return sum(1 for t in self.ready_at if t <= now)

    def resize(self, now: float, target: int) -> None:
        while len(self.ready_at) < target:
            self.ready_at.append(now + self.startup_delay)
        # Removing the latest-started first: a starting replica costs nothing to drop.
        self.ready_at.sort()
        del self.ready_at[target:]


def simulate(
    config: AutoscalingConfig,
    trace: list[tuple[float, int]],
    startup_delay: float,
    initial_replicas: int | None = None,
) -> list[dict]:
    pool = SimulatedPool(startup_delay)
    start = trace[0][0] if trace else 0.0
    # The deployment exists before the trace begins (at min replicas unless
    # told otherwise), all of them ready.
    initial = config.min_replicas if initial_replicas is None else initial_replicas
    pool.ready_at = [start - startup_delay] * initial
    state = AutoscalerState()
    rows = []
    held_since: float | None = None  # when the first request found no replica
    for now, queue_depth in trace:
        ready = pool.ready(now)
        hold_s = None
        if ready == 0 and queue_depth > 0 and held_since is None:
            held_since = now
        elif ready > 0 and held_since is not None:
            hold_s, held_since = now - held_since, None
        obs = Observation(now, queue_depth, ready, len(pool.ready_at))
        decision = decide(config, obs, state)
        state = decision.state
        pool.resize(now, decision.desired_replicas)
        rows.append(
            {
                "time_s": now,
                "queue_depth": queue_depth,
                "ready_replicas": ready,
                "desired_replicas": decision.desired_replicas,
                "utilization": round(decision.utilization, 3),
                "action": decision.action.value,
                "held": queue_depth if ready == 0 else 0,
                "hold_s": "" if hold_s is None else round(hold_s, 3),
            }
        )
    return rows


def read_trace(text: str) -> list[tuple[float, int]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = {"time_s", "queue_depth"} - set(reader.fieldnames or [])
    if missing:
        raise ValueError(f"trace needs columns time_s,queue_depth; missing {sorted(missing)}")
    rows = [(float(r["time_s"]), int(float(r["queue_depth"]))) for r in reader]
    if any(b[0] < a[0] for a, b in zip(rows, rows[1:], strict=False)):
        raise ValueError("trace time_s must not go backwards")
    return rows


def load_spec(path: Path | None) -> dict:
    if path is None:
        return {}
    doc = yaml.safe_load(path.read_text())
    errors = validate(doc)
    if errors:
        raise ValueError(f"{path} is not a valid ModelDeployment:\n  " + "\n  ".join(errors))
    return doc["spec"]


def format_rows(rows: list[dict], fmt: str) -> str:
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
    cells = [COLUMNS] + [[_cell(row[c]) for c in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "".join(
        "  ".join(value.rjust(width) for value, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in cells
    )


def _cell(value) -> str:
    if value == "":
        return "-"  # so the table's columns still line up
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="maas operator simulate",
        description="Run the autoscaling policy over a queue-depth trace "
        "(CSV: time_s,queue_depth).",
    )
    parser.add_argument("--trace", type=Path, required=True, help="CSV with time_s,queue_depth")
    parser.add_argument("--spec", type=Path, help="a ModelDeployment YAML; default: CRD defaults")
    parser.add_argument(
        "--startup-delay", type=float, default=30.0, help="seconds a new replica takes to be ready"
    )
    parser.add_argument("--format", choices=["table", "csv"], default="table")
    args = parser.parse_args(argv)
    try:
        config = autoscaling_config(load_spec(args.spec))
        trace = read_trace(args.trace.read_text())
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    rows = simulate(config, trace, args.startup_delay)
    sys.stdout.write(format_rows(rows, args.format))
    scaled = sum(
        1
        for r in rows
        if r["action"] in {a.value for a in (Action.PREWARM, Action.SCALE_OUT, Action.SCALE_IN)}
    )
    print(f"# {scaled} scaling actions over {len(rows)} rows", file=sys.stderr)
    holds = [r["hold_s"] for r in rows if r["hold_s"] != ""]
    if holds:
        print(f"# {len(holds)} cold starts; longest hold {max(holds):g}s", file=sys.stderr)
    return 0
