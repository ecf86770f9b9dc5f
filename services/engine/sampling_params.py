"""What a request asks of the sampler, with OpenAI-style defaults."""

import math
from dataclasses import dataclass, field

MAX_N = 16
MAX_TOP_LOGPROBS = 20
# torch.Generator.manual_seed accepts exactly this range.
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1


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

    def validate(self) -> None:
        """Raise ValueError naming the first field that holds an impossible value."""
        # Comparisons are written so that NaN fails them.
        checks = [
            (
                "temperature",
                self.temperature >= 0 and math.isfinite(self.temperature),
                "must be >= 0",
            ),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 disables it)"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            (
                "repetition_penalty",
                self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty),
                "must be > 0",
            ),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            (
                "seed",
                self.seed is None or _SEED_MIN <= self.seed <= _SEED_MAX,
                "must fit in 64 bits",
            ),
            ("max_tokens", self.max_tokens > 0, "must be > 0"),
            ("min_tokens", 0 <= self.min_tokens <= self.max_tokens, "must be in [0, max_tokens]"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
            ("stop_token_ids", all(i >= 0 for i in self.stop_token_ids), "must be >= 0"),
            ("n", 1 <= self.n <= MAX_N, f"must be in [1, {MAX_N}]"),
            (
                "top_logprobs",
                0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
                f"must be in [0, {MAX_TOP_LOGPROBS}]",
            ),
        ]
        for name, ok, requirement in checks:
            if not ok:
                raise ValueError(f"{name} {requirement}, got {getattr(self, name)!r}")
