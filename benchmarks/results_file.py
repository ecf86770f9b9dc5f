"""Benchmarks that share one results file each own a key of it."""

import json
from pathlib import Path


def update_results(path: Path, key: str, section: dict) -> None:
    """Write section under key, keeping the other benchmarks' keys as they are."""
    results = json.loads(path.read_text()) if path.exists() else {}
    results[key] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def report(results: dict, output: Path | None) -> None:
    """Print a benchmark's results, and write them to `output` when given."""
    print(json.dumps(results, indent=2))
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
