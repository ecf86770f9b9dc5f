"""The known-answer check on the real model: its reference, a right model and a wrong one."""

import copy
import json

import pytest
import torch

from maas_services.common.model_cache import derived_folder
from maas_services.engine.known_answer import TEXTS_DIGEST, judge, known_token_ids, score_native
from maas_services.engine.known_answer_reference import CACHE_FILE, cached_reference, reference
from maas_services.engine.settings import EngineSettings

TOLERANCE = EngineSettings().known_answer_tolerance


@pytest.fixture(scope="module")
def float32_reference(smollm_path) -> float:
    return reference("cache", smollm_path)


@pytest.fixture(scope="module")
def float32_model(model):
    return model[0]  # load_model's (model, config)


def perturbed(model, scale: float):
    """A copy of `model` whose every weight has noise of `scale` times its spread added."""
    wrong = copy.deepcopy(model)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in wrong.parameters():
            weight.add_(torch.randn(weight.shape, generator=noise) * scale * weight.std())
    return wrong


def test_the_reference_is_kept_beside_the_model(smollm_path, float32_reference):
    kept = json.loads((derived_folder(smollm_path) / CACHE_FILE).read_text())
    assert kept["texts"] == TEXTS_DIGEST and kept["tokens"] > 100
    assert cached_reference(smollm_path) == float32_reference
    assert reference("bound", smollm_path) is None
    assert reference("7.5", smollm_path) == 7.5


def test_the_float32_model_matches_its_reference(float32_model, tokenizer, float32_reference):
    score = score_native(float32_model, known_token_ids(tokenizer))
    assert score.perplexity == pytest.approx(float32_reference, rel=1e-4)
    assert judge(score.perplexity, float32_reference, TOLERANCE).passed


def test_a_model_with_wrong_weights_fails_against_the_reference(
    float32_model, tokenizer, float32_reference
):
    score = score_native(perturbed(float32_model, 0.1), known_token_ids(tokenizer))
    verdict = judge(score.perplexity, float32_reference, TOLERANCE)
    assert not verdict.passed
    assert "off the float32 reference" in verdict.failure
