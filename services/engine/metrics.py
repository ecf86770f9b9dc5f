"""Engine metrics (maas_engine_*): the signals the router and autoscaler use."""

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

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
