"""`maas conformance BASE_URL`: run the checks, print the table or JSON, exit 0 or 1
(2 when there is nothing to test: the server unreachable, no model listed)."""

import argparse
import sys
from pathlib import Path

import httpx

from maas_tools.conformance.registry import GROUPS, run_all
from maas_tools.conformance.report import document, table
from maas_tools.conformance.result import Outcome
from maas_tools.conformance.target import Options, Target


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maas conformance",
        description="Hold an OpenAI-compatible server to the API's contract. Exit 0 when "
        "every check the server offers passes, 1 otherwise.",
    )
    p.add_argument("base_url", help="as an OpenAI client takes it, e.g. http://host:8080/v1")
    p.add_argument("--key", default="", help="API key sent as a Bearer token")
    p.add_argument("--model", default="", help="model to ask for (default: the first listed)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--output", type=Path, help="write the report here instead of stdout")
    p.add_argument(
        "--metrics-url",
        default="",
        help="Prometheus text with a running-request gauge (the disconnect check)",
    )
    p.add_argument("--running-metric", default="", help="that gauge's name (default: known names)")
    p.add_argument(
        "--rate-limit-probe",
        type=int,
        default=0,
        metavar="N",
        help="send at most N cheap requests looking for a 429 (default 0: not probed)",
    )
    p.add_argument("--rate-limit-key", default="", help="key for that burst (default: --key)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GROUP",
        choices=GROUPS,
        help="run only this group (repeatable)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    options = Options(
        base_url=args.base_url,
        key=args.key,
        model=args.model,
        timeout=args.timeout,
        metrics_url=args.metrics_url,
        running_metric=args.running_metric,
        rate_limit_probe=args.rate_limit_probe,
        rate_limit_key=args.rate_limit_key,
    )
    try:
        target = Target(options)
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        # No model to test: not a verdict on the server's conformance.
        print(f"maas conformance: cannot start against {args.base_url}: {exc}", file=sys.stderr)
        return 2
    try:
        results = []
        for result in run_all(target, lambda c: not args.only or c.group in args.only):
            results.append(result)
            if args.format == "table" and args.output is None:
                print(f"{result.id}: {result.outcome}", file=sys.stderr, flush=True)
    finally:
        target.close()
    text = (
        table(results) if args.format == "table" else document(args.base_url, target.model, results)
    )
    if args.output:
        args.output.write_text(text + "\n")
    else:
        print(text)
    return 1 if any(r.outcome is Outcome.FAIL for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
