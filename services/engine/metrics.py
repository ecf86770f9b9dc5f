"""Engine metrics (maas_engine_*): the signals the router and autoscaler use.

The engine loop records a step in one call, record_step, from the StepStats
its phases filled in; nothing in the step's logic touches a series itself.
"""

from prometheus_client import Counter, Gauge, Histogram

from maas_services.common.metrics import LATENCY_BUCKETS
from maas_services.engine.step_stats import StepStats

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256)

REQUESTS_RUNNING = Gauge("maas_engine_requests_running", "Sequences in the running batch")
REQUESTS_WAITING = Gauge("maas_engine_requests_waiting", "Sequences waiting to be admitted")
KV_CACHE_USAGE = Gauge("maas_engine_kv_cache_usage_ratio", "Fraction of KV blocks in use")
PREFIX_QUERIED = Counter(
    "maas_engine_prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache"
)
PREFIX_HITS = Counter(
    "maas_engine_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache"
)
PREEMPTIONS = Counter("maas_engine_preemptions", "Sequences preempted for recompute")
PROMPT_TOKENS = Counter("maas_engine_prompt_tokens", "Prompt tokens of admitted requests")
GENERATION_TOKENS = Counter("maas_engine_generation_tokens", "Tokens generated")
REQUESTS_FINISHED = Counter("maas_engine_requests_finished", "Finished requests", ["finish_reason"])
TTFT_SECONDS = Histogram(
    "maas_engine_time_to_first_token_seconds",
    "From arrival to the first generated token",
    buckets=LATENCY_BUCKETS,
)
TPOT_SECONDS = Histogram(
    "maas_engine_time_per_output_token_seconds",
    "Mean time per output token after the first, per request",
    buckets=LATENCY_BUCKETS,
)
ITL_SECONDS = Histogram(
    "maas_engine_inter_token_latency_seconds",
    "Time between consecutive tokens of a sequence",
    buckets=LATENCY_BUCKETS,
)
E2E_SECONDS = Histogram(
    "maas_engine_e2e_request_latency_seconds", "From arrival to finish", buckets=LATENCY_BUCKETS
)
QUEUE_SECONDS = Histogram(
    "maas_engine_queue_time_seconds", "From arrival to first admission", buckets=LATENCY_BUCKETS
)
BATCH_SIZE = Histogram(
    "maas_engine_batch_size", "Sequences in one model step", buckets=BATCH_BUCKETS
)
STEP_TOKENS = Histogram(
    "maas_engine_step_tokens",
    "Tokens computed in one model step",
    buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
)
SPEC_DRAFT_TOKENS = Counter("maas_engine_spec_draft_tokens", "Speculative tokens proposed")
SPEC_ACCEPTED_TOKENS = Counter("maas_engine_spec_accepted_tokens", "Speculative tokens accepted")
SPEC_ACCEPTED_LENGTH = Histogram(
    "maas_engine_spec_accepted_length",
    "Draft tokens accepted per verification",
    buckets=(0, 1, 2, 3, 4, 5, 6, 8, 10, 16),
)
SPEC_PROPOSER_SECONDS = Histogram(
    "maas_engine_spec_proposer_seconds",
    "Time to propose guesses for one step's sequences",
    buckets=LATENCY_BUCKETS,
)
STEP_PHASE_SECONDS = Histogram(
    "maas_engine_step_phase_seconds",
    "Wall time of one phase of an engine step",
    ["phase"],
    buckets=LATENCY_BUCKETS,
)

LORA_ADAPTERS_LOADED = Gauge(
    "maas_engine_lora_adapters_loaded", "LoRA adapters loaded, in use or idle"
)
LORA_ADAPTER_LOADS = Counter(
    "maas_engine_lora_adapter_loads",
    "LoRA adapter loads by result: loaded, or why not (invalid, slots_full, lora_disabled, error)",
    ["result"],
)
LORA_ADAPTER_EVICTIONS = Counter(
    "maas_engine_lora_adapter_evictions",
    "Idle LoRA adapters unloaded, least recently used first, to make room for a load",
)


def record_load(running: int, waiting: int, kv_cache_usage: float) -> None:
    REQUESTS_RUNNING.set(running)
    REQUESTS_WAITING.set(waiting)
    KV_CACHE_USAGE.set(kv_cache_usage)


def record_step(stats: StepStats) -> None:
    PREFIX_QUERIED.inc(stats.prefix_queried_tokens)
    PREFIX_HITS.inc(stats.prefix_hit_tokens)
    PROMPT_TOKENS.inc(stats.prompt_tokens)
    for seconds in stats.queue_seconds:
        QUEUE_SECONDS.observe(seconds)
    PREEMPTIONS.inc(stats.num_preempted)
    if stats.batch_size:
        BATCH_SIZE.observe(stats.batch_size)
        STEP_TOKENS.observe(stats.num_prefill_tokens + stats.num_decode_tokens)
    GENERATION_TOKENS.inc(stats.num_generated_tokens)
    for seconds in stats.ttft_seconds:
        TTFT_SECONDS.observe(seconds)
    for seconds in stats.itl_seconds:
        ITL_SECONDS.observe(seconds)
    for finished in stats.finished:
        REQUESTS_FINISHED.labels(finished.reason).inc()
        if finished.e2e_seconds is not None:
            E2E_SECONDS.observe(finished.e2e_seconds)
        if finished.tpot_seconds is not None:
            TPOT_SECONDS.observe(finished.tpot_seconds)
    for drafted, accepted in stats.verifications:
        SPEC_DRAFT_TOKENS.inc(drafted)
        SPEC_ACCEPTED_TOKENS.inc(accepted)
        SPEC_ACCEPTED_LENGTH.observe(accepted)
    if stats.propose_seconds is not None:
        SPEC_PROPOSER_SECONDS.observe(stats.propose_seconds)
    for phase, seconds in stats.phase_seconds.items():
        STEP_PHASE_SECONDS.labels(phase).observe(seconds)
    record_load(stats.num_running, stats.num_waiting, stats.kv_cache_usage)
