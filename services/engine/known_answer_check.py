"""One replica's known-answer check: score, compare with the reference, log the verdict.

Both backends end here: the native engine core scores with its serving model
(check_native, before it tells the serving process it is ready), the vLLM
adapter with vLLM's prompt logprobs (vllm_backend/known_answer.py), and each
passes its score to judge_score. What is checked and why: known_answer.py.
"""

from pathlib import Path

from maas_services.common.logging import get_logger
from maas_services.common.model_files import resolve_model_path
from maas_services.engine.known_answer import (
    QUANTIZED_TOLERANCE,
    Score,
    Verdict,
    judge,
    known_token_ids,
    score_native,
)
from maas_services.engine.known_answer_reference import reference
from maas_services.engine.llm_engine import LLMEngine
from maas_services.engine.quantization.quantize import holds_checkpoint_weights
from maas_services.engine.settings import EngineSettings

log = get_logger(__name__)


def judge_score(
    score: Score, settings: EngineSettings, model_path: Path, backend: str, quantized: bool = False
) -> Verdict:
    tolerance = settings.known_answer_tolerance
    if quantized:
        tolerance = max(tolerance, QUANTIZED_TOLERANCE)
    verdict = judge(score.perplexity, reference(settings.known_answer, model_path), tolerance)
    fields = {
        "backend": backend,
        "perplexity": round(score.perplexity, 4),
        "reference": None if verdict.reference is None else round(verdict.reference, 4),
        "tolerance": tolerance,
        "tokens": score.tokens,
        "seconds": round(score.seconds, 3),
    }
    if verdict.passed:
        log.info("known_answer_passed", **fields)
    else:
        log.error("known_answer_failed", reason=verdict.failure, **fields)
    return verdict


def check_native(engine: LLMEngine, settings: EngineSettings) -> str:
    """Why this engine must not serve; empty when it passed (or --known-answer off)."""
    if settings.known_answer == "off":
        return ""
    runner = engine.runner
    texts = known_token_ids(engine.tokenizer)
    score = score_native(runner.model, texts, runner.device, runner.path, runner.kv_cache.k.dtype)
    path = resolve_model_path(settings.model_path)
    quantized = not holds_checkpoint_weights(runner.model)
    return judge_score(score, settings, path, "native", quantized).failure
