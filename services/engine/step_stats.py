"""What one engine step did: filled in by its phases, recorded once (metrics.record_step).

The step's logic only counts and times; turning that into Prometheus series
is metrics.py's concern, so the two can change apart.
"""

from dataclasses import dataclass, field


@dataclass
class FinishedRequest:
    reason: str  # stop, length or error
    e2e_seconds: float | None = None  # arrival to finish; None for an error
    tpot_seconds: float | None = None  # mean time per token after the first, if it had two


@dataclass
class StepStats:
    # Schedule: what the batch holds.
    batch_size: int = 0
    num_prefill_tokens: int = 0  # prompt (or recomputed) positions computed
    num_decode_tokens: int = 0  # last-token positions of decodes, drafts included
    num_preempted: int = 0
    # Prompt tokens looked up in the prefix cache at each admission, and found.
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    # Requests admitted for the first time: their prompt sizes and time queued.
    prompt_tokens: int = 0
    queue_seconds: list[float] = field(default_factory=list)
    # Postprocess: tokens appended and the latencies they close.
    num_generated_tokens: int = 0
    ttft_seconds: list[float] = field(default_factory=list)
    itl_seconds: list[float] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)
    # Speculation: (drafted, accepted) per verified sequence; the proposer's time.
    verifications: list[tuple[int, int]] = field(default_factory=list)
    propose_seconds: float | None = None
    # Wall time of each phase that ran, by name (propose, schedule, forward, postprocess).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # The engine's state once the step is done.
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
