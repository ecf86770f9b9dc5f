"""Engine metrics (maas_engine_*), the signals the router and autoscaler use."""

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

REQUESTS_RUNNING = Gauge("maas_engine_requests_running", "Requests being decoded")
REQUESTS_WAITING = Gauge("maas_engine_requests_waiting", "Requests queued for the model")
PROMPT_TOKENS = Counter("maas_engine_prompt_tokens", "Prompt tokens processed")
GENERATION_TOKENS = Counter("maas_engine_generation_tokens", "Tokens generated")
REQUESTS_FINISHED = Counter("maas_engine_requests_finished", "Finished requests", ["finish_reason"])
TTFT_SECONDS = Histogram(
    "maas_engine_time_to_first_token_seconds",
    "From arrival to the first generated token",
    buckets=LATENCY_BUCKETS,
)
QUEUE_SECONDS = Histogram(
    "maas_engine_queue_time_seconds", "Time waiting for the model", buckets=LATENCY_BUCKETS
)
E2E_SECONDS = Histogram(
    "maas_engine_e2e_request_latency_seconds", "From arrival to finish", buckets=LATENCY_BUCKETS
)
