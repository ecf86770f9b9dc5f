"""Who may start a grammar compile (services/tokenizer/compile_admission.py)."""

import pytest

from maas_services.tokenizer.compile_admission import CompileAdmission, CompileRefused


class Clock:
    """Time the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_compile_in_flight_per_tenant_while_others_are_admitted():
    admission = CompileAdmission(budget_s_per_minute=60, max_in_flight=8)
    admission.admit("a")
    with pytest.raises(CompileRefused, match="already has a grammar compile in flight"):
        admission.admit("a")
    admission.admit("b")
    admission.release("a", 0.5)
    admission.admit("a")


def test_the_number_in_flight_is_bounded_overall():
    admission = CompileAdmission(budget_s_per_minute=60, max_in_flight=2)
    admission.admit("a")
    admission.admit("b")
    with pytest.raises(CompileRefused, match="2 grammar compiles are in flight"):
        admission.admit("c")


def test_compile_seconds_are_charged_until_the_budget_is_spent_then_it_refills():
    clock = Clock()
    admission = CompileAdmission(budget_s_per_minute=6, max_in_flight=8, clock=clock)
    admission.admit("a")
    admission.release("a", 9.0)  # a killed compile: more than the budget, charged in full
    with pytest.raises(CompileRefused, match="budget") as refused:
        admission.admit("a")
    # 3 CPU seconds in debt at 0.1 a second: 30 s.
    assert refused.value.retry_after_s == 30
    admission.admit("b")  # another tenant's budget is its own
    clock.now = 31
    admission.admit("a")
