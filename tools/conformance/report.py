"""The results as a table for a terminal or a JSON document for a scoreboard."""

import json
from collections import Counter

from maas_tools.conformance.result import CheckResult, Outcome

DETAIL_WIDTH = 100


def summary(results: list[CheckResult]) -> dict[str, int]:
    counts = Counter(r.outcome for r in results)
    return {str(o): counts.get(o, 0) for o in Outcome}


def table(results: list[CheckResult]) -> str:
    width = max((len(r.id) for r in results), default=5)
    lines = [f"{'check':<{width}}  {'outcome':<11}  detail"]
    for r in results:
        detail = " ".join(r.detail.split())
        if len(detail) > DETAIL_WIDTH:
            detail = detail[: DETAIL_WIDTH - 3] + "..."
        lines.append(f"{r.id:<{width}}  {r.outcome!s:<11}  {detail}")
    counts = summary(results)
    lines.append(", ".join(f"{n} {o}" for o, n in counts.items()))
    return "\n".join(lines)


def document(base_url: str, model: str, results: list[CheckResult]) -> str:
    return json.dumps(
        {
            "base_url": base_url,
            "model": model,
            "summary": summary(results),
            "checks": [r.as_json() for r in results],
        },
        indent=2,
    )
