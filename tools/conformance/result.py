"""What one check found: plain data for the table and the JSON report."""

from dataclasses import asdict, dataclass
from enum import StrEnum


class Outcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_OFFERED = "not offered"


@dataclass
class CheckResult:
    group: str
    name: str
    outcome: Outcome
    # Why it failed or is not offered; what was seen when it passed ("" for nothing to say).
    detail: str = ""

    @property
    def id(self) -> str:
        return f"{self.group}.{self.name}"

    def as_json(self) -> dict:
        return {**asdict(self), "id": self.id, "outcome": str(self.outcome)}


class CheckFailed(Exception):
    """Raised by a check: the server broke the contract (the message says how)."""


class NotOffered(Exception):
    """Raised by a check: the server does not serve this part of the API."""


def expect(condition: object, why: str) -> None:
    """A check's assertion: `why` is what the report says when it does not hold."""
    if not condition:
        raise CheckFailed(why)
