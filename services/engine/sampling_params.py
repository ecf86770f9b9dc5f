"""What a request asks of the sampler, with OpenAI-style defaults.

validate() is the one place every field is checked against the model's
vocabulary and the engine's limits: a value that passes it cannot make the
sampler, the stop-string matcher or a sample's random stream raise inside a
step, where a failure would cost the whole batch a retry (llm_engine.py).
The bounds are those of the gateway's API where it has one, so anything the
gateway accepts runs; the engine checks again because it has other callers.

Seeds: OpenAI accepts any 64-bit seed, and sample i of a request with n > 1
draws from seed + i. That sum wraps modulo 2**64 (sample_seed) rather than
being refused: every seed the API accepts then works for every n, the
samples' streams stay distinct (n is far below 2**64) and deterministic.

An embedding request (embedding set) is a prefill with no decode
(services/engine/embedding.py): max_tokens is 0 and nothing that shapes a
sample applies, so validate() refuses whatever would ask for one.
"""

import math
from dataclasses import dataclass, field

from maas_services.common.grammar.spec import GrammarError, GrammarSpec

MAX_N = 16
MAX_TOP_LOGPROBS = 20
# OpenAI's and the gateway's bounds on stop strings; each is matched against
# every token's text, so their total length bounds the per-token work.
MAX_STOPS = 16
MAX_STOP_CHARS = 256
# No tokenizer needs more; banning (min_tokens) thousands of ids per step
# would make one request's sampling as slow as a batch's.
MAX_STOP_TOKEN_IDS = 256
# Dividing a logit by a smaller penalty overflows float32 to inf, and an inf
# logit turns the softmax into NaN; the gateway's bound above is 2.
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 2.0
SEED_MODULUS = 2**64


@dataclass
class EmbeddingParams:
    """An embedding request: keep the first `dimensions` of the vector (0: all of them)."""

    dimensions: int = 0


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    n: int = 1  # parallel samples of one prompt
    logprobs: bool = False
    top_logprobs: int = 0
    speculative: bool = False  # opt in to speculative decoding, where the engine has it
    # Structured outputs: every sample follows this grammar (services/common/grammar/spec.py).
    grammar: GrammarSpec | None = None
    # Output already delivered by a replica that failed (a migrated request,
    # docs/gateway.md "Migration"): generation continues after these tokens as
    # if this engine had sampled them (llm_engine.py replays them).
    resume_ids: list[int] = field(default_factory=list)
    # Set: answer the prompt's embedding instead of generating (embedding.py).
    embedding: EmbeddingParams | None = None

    def sample_seed(self, index: int) -> int | None:
        """The seed of sample `index`'s random stream (see the module docstring)."""
        return None if self.seed is None else (self.seed + index) % SEED_MODULUS

    def validate(self, vocab_size: int, hidden_size: int) -> None:
        """Raise ValueError naming the first field that holds an impossible value."""
        if self.embedding is not None:
            return self._validate_embedding(hidden_size)
        # Comparisons are written so that NaN fails them.
        checks = [
            (
                "temperature",
                self.temperature >= 0 and math.isfinite(self.temperature),
                "must be >= 0",
            ),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", 0 <= self.top_k <= vocab_size, f"must be in [0, {vocab_size}] (0: off)"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            (
                "repetition_penalty",
                MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
                f"must be in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY}]",
            ),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            (
                "seed",
                self.seed is None or 0 <= self.seed < SEED_MODULUS,
                "must be in [0, 2**64)",
            ),
            ("max_tokens", self.max_tokens > 0, "must be > 0"),
            ("min_tokens", 0 <= self.min_tokens <= self.max_tokens, "must be in [0, max_tokens]"),
            ("stop", len(self.stop) <= MAX_STOPS, f"must hold at most {MAX_STOPS} strings"),
            (
                "stop",
                all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in self.stop),
                f"must be non-empty strings of at most {MAX_STOP_CHARS} characters",
            ),
            (
                "stop_token_ids",
                len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
                f"must hold at most {MAX_STOP_TOKEN_IDS} ids",
            ),
            (
                "stop_token_ids",
                all(0 <= i < vocab_size for i in self.stop_token_ids),
                f"must be token ids in [0, {vocab_size})",
            ),
            ("n", 1 <= self.n <= MAX_N, f"must be in [1, {MAX_N}]"),
            (
                "top_logprobs",
                0 <= self.top_logprobs <= min(MAX_TOP_LOGPROBS, vocab_size),
                f"must be in [0, {min(MAX_TOP_LOGPROBS, vocab_size)}]",
            ),
            (
                "resume_ids",
                len(self.resume_ids) < self.max_tokens,
                "must be fewer than max_tokens",
            ),
            ("resume_ids", not self.resume_ids or self.n == 1, "need n = 1"),
            (
                "resume_ids",
                all(0 <= i < vocab_size for i in self.resume_ids),
                f"must be token ids in [0, {vocab_size})",
            ),
        ]
        _check(self, checks)
        if self.grammar is not None:
            try:
                self.grammar.check()
            except GrammarError as exc:
                raise ValueError(f"grammar: {exc}") from None

    def _validate_embedding(self, hidden_size: int) -> None:
        # The sampling fields are left at their defaults; the ones that would
        # ask for output are refused by name.
        checks = [
            (
                "embedding.dimensions",
                0 <= self.embedding.dimensions <= hidden_size,
                f"must be in [1, {hidden_size}] (0: the model's hidden size)",
            ),
            ("max_tokens", self.max_tokens == 0, "must be 0 for an embedding"),
            ("n", self.n == 1, "must be 1 for an embedding"),
            ("logprobs", not self.logprobs, "must be off for an embedding"),
            ("grammar", self.grammar is None, "must be unset for an embedding"),
            ("resume_ids", not self.resume_ids, "must be empty for an embedding"),
        ]
        _check(self, checks)


def _check(params: SamplingParams, checks: list[tuple[str, bool, str]]) -> None:
    for name, ok, requirement in checks:
        if not ok:
            value = params
            for part in name.split("."):
                value = getattr(value, part)
            raise ValueError(f"{name} {requirement}, got {_shown(value)}")


def _shown(value) -> str:
    # The message goes back to the client: a list of 10,000 long strings must not.
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
