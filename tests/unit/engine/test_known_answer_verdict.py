"""The known-answer verdict, its tolerance and the --known-answer setting."""

import math

import pytest
from pydantic import ValidationError

from maas_services.engine.known_answer import SANITY_BOUND, Score, judge
from maas_services.engine.known_answer_check import judge_score
from maas_services.engine.settings import EngineSettings


def test_within_the_tolerance_passes_either_way():
    assert judge(10.5, 10.0, 0.15).passed
    assert judge(9.0, 10.0, 0.15).passed


def test_far_from_the_reference_fails_and_says_why():
    verdict = judge(27.3, 8.98, 0.15)
    assert not verdict.passed and verdict.reference == 8.98
    assert "27.300 is +204.0% off the float32 reference 8.980 (tolerance 15%)" in verdict.failure


def test_nan_never_passes():
    assert not judge(math.nan, 8.98, 0.15).passed
    assert not judge(math.nan, None, 0.15).passed


def test_without_a_reference_only_the_sanity_bound_applies():
    assert judge(SANITY_BOUND * 0.9, None, 0.15).passed
    verdict = judge(SANITY_BOUND * 10, None, 0.15)
    assert not verdict.passed and verdict.reference is None
    assert "sanity bound" in verdict.failure


@pytest.mark.parametrize("value", ["cache", "bound", "off", "8.98", "1"])
def test_known_answer_setting_takes_a_source_or_a_perplexity(value):
    assert EngineSettings(known_answer=value).known_answer == value


@pytest.mark.parametrize("value", ["", "0.5", "-3", "nan", "inf", "ten"])
def test_known_answer_setting_refuses_anything_else(value):
    with pytest.raises(ValidationError, match="cache, bound, off or a perplexity"):
        EngineSettings(known_answer=value)


def test_a_quantized_engine_is_allowed_its_other_weights_but_not_garbage(tmp_path):
    # int4 requantized at group 64 scored +89% on SmolLM2 (known_answer.py).
    settings = EngineSettings(known_answer="8.0")
    requantized, garbage = Score(15.1, 162, 0.1), Score(40.0, 162, 0.1)
    assert not judge_score(requantized, settings, tmp_path, "native").passed
    assert judge_score(requantized, settings, tmp_path, "native", quantized=True).passed
    assert not judge_score(garbage, settings, tmp_path, "native", quantized=True).passed
