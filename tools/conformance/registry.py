"""The checks, in the order they run: one group per module under checks/.

A check is a function of the Target that returns a short note (or None) when
the server holds to the contract, raises CheckFailed when it does not and
NotOffered when it does not serve that part of the API. `@check(group, name)`
lists it; `run_all` runs every one and turns each outcome into a CheckResult,
so one broken check never stops the others.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from maas_tools.conformance.result import CheckFailed, CheckResult, NotOffered, Outcome
from maas_tools.conformance.target import Target

GROUPS = (
    "models",
    "streaming",
    "parallel",
    "logprobs",
    "tool_calls",
    "response_format",
    "errors",
    "usage",
    "rate_limit",
    "disconnect",
    "endpoints",
)


@dataclass(frozen=True)
class Check:
    group: str
    name: str
    run: Callable[[Target], str | None]


CHECKS: list[Check] = []


def check(group: str, name: str):
    def register(run: Callable[[Target], str | None]):
        CHECKS.append(Check(group, name, run))
        return run

    return register


def all_checks() -> list[Check]:
    for group in GROUPS:
        importlib.import_module(f"maas_tools.conformance.checks.{group}")
    return sorted(CHECKS, key=lambda c: GROUPS.index(c.group))


def run_one(target: Target, chosen: Check) -> CheckResult:
    def result(outcome: Outcome, detail: str) -> CheckResult:
        return CheckResult(chosen.group, chosen.name, outcome, detail)

    target.fresh_connections()
    try:
        note = chosen.run(target)
    except NotOffered as exc:
        return result(Outcome.NOT_OFFERED, str(exc))
    except CheckFailed as exc:
        return result(Outcome.FAIL, str(exc))
    except httpx.HTTPError as exc:
        return result(Outcome.FAIL, f"{type(exc).__name__}: {exc}")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # A field missing or of the wrong type where the contract names it.
        return result(Outcome.FAIL, f"unexpected shape: {type(exc).__name__}: {exc}")
    return result(Outcome.PASS, note or "")


def run_all(target: Target, selected: Callable[[Check], bool] = lambda c: True):
    for chosen in all_checks():
        if selected(chosen):
            yield run_one(target, chosen)
