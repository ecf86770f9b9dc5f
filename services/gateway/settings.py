from typing import Literal

from pydantic import Field

from maas_services.common.defaults import GATEWAY_HTTP_PORT, ROUTER_PORT, TOKENIZER_PORT
from maas_services.common.redis_client import DEFAULT_REDIS_URL
from maas_services.common.settings import ServiceSettings


class GatewaySettings(ServiceSettings):
    port: int = Field(GATEWAY_HTTP_PORT, ge=0, le=65535, description="HTTP port (OpenAI API)")
    grpc_port: int = Field(0, ge=0, le=65535, description="tenant gRPC port (0 picks one)")
    grpc_max_concurrent_rpcs: int = Field(
        1024,
        ge=1,
        description="calls past their key check on the tenant gRPC port; more get"
        " RESOURCE_EXHAUSTED",
    )
    redis_url: str = Field(DEFAULT_REDIS_URL, description="Redis with tenants, keys and usage")
    tokenizer_address: str = Field(
        f"127.0.0.1:{TOKENIZER_PORT}", description="tokenizer service HOST:PORT"
    )
    router_address: str = Field(f"127.0.0.1:{ROUTER_PORT}", description="router service HOST:PORT")
    models_cache_seconds: float = Field(2.0, ge=0, description="how long the model list is reused")
    routes_file: str = Field(
        "", description="routing table YAML, re-read when it changes; empty = every model as is"
    )
    routes_poll_seconds: float = Field(1.0, gt=0, description="how often the routes file is read")
    routes_configmap: str = Field(
        "",
        description="the operator's routes ConfigMap, watched through the Kubernetes API and "
        "merged over routes_file; empty = none",
    )
    routes_configmap_namespace: str = Field(
        "", description="namespace of routes_configmap; empty = the gateway's own"
    )
    kubeconfig: str = Field(
        "", description="for routes_configmap outside a cluster: kubeconfig path (empty = default)"
    )
    # Scale to zero: requests for a deployment with no ready replica wait for one.
    hold_max_requests: int = Field(
        64, ge=0, description="requests held per deployment at most; more get 503"
    )
    hold_max_requests_per_tenant: int = Field(
        16, ge=0, description="of those, held for one tenant at most; more get 503"
    )
    hold_timeout_seconds: float = Field(
        120.0, gt=0, description="how long a request waits for a replica to start, then 503"
    )
    billing_address: str = Field("", description="billing service HOST:PORT, for /v1/usage")
    usage_spool_dir: str = Field(
        ".maas/spool", description="durable folder for usage events while Redis is down"
    )
    usage_spool_claim_dir: str = Field(
        "",
        description="folder holding every replica's spool folder; this replica replays"
        " those whose owner is gone (empty: only its own)",
    )

    # Engine calls.
    connect_timeout_seconds: float = Field(5.0, gt=0, description="to reach an engine")
    first_token_timeout_seconds: float = Field(
        120.0, gt=0, description="from sending to an engine until its first token"
    )
    request_timeout_seconds: float = Field(600.0, gt=0, description="total time for one request")
    max_attempts: int = Field(
        3, ge=1, description="engine replicas tried per request, while no token was sent"
    )
    max_migrations: int = Field(
        2,
        ge=0,
        description="times one request may be resumed on another replica after its engine"
        " failed under it (0: a failed engine ends its streams); the wait for a replica is"
        " hold_timeout_seconds",
    )
    adapter_loads_per_minute: int = Field(
        10,
        ge=1,
        description="on-demand LoRA adapter loads a tenant may cause per minute, across the"
        " gateway's replicas (counted in Redis), unless its own limit says otherwise"
        " (upstream/adapter_loads.py)",
    )
    adapter_load_timeout_seconds: float = Field(
        60.0, gt=0, description="for an engine to load an adapter on demand"
    )
    breaker_failures: int = Field(3, ge=1, description="failures in a row that open a breaker")
    breaker_cooldown_seconds: float = Field(
        5.0, gt=0, description="how long an open breaker keeps an endpoint out"
    )

    # Admission.
    queue_size: int = Field(256, ge=0, description="requests that may wait per deployment")
    queue_timeout_seconds: float = Field(30.0, gt=0, description="longest wait for a slot")

    # Tenants and limits.
    auth_cache_seconds: float = Field(
        0.5, ge=0, lt=1, description="how long a checked key is trusted (revocation delay)"
    )
    auth_on_redis_error: Literal["fail_closed", "fail_open"] = Field(
        "fail_closed",
        description="Redis down: refuse (503), or serve keys this replica already checked",
    )
    auth_max_stale_seconds: float = Field(
        300.0,
        gt=0,
        description="fail_open: the oldest check of a key still served while Redis is down",
    )
    rate_limit_on_redis_error: Literal["fail_open", "fail_closed"] = Field(
        "fail_open", description="Redis down: serve without limits (logged, counted), or 503"
    )

    # The public HTTP front: what a client can hold before it is authenticated.
    max_connections: int = Field(
        1024, ge=1, description="open HTTP connections; one more is answered 503 and closed"
    )
    max_header_bytes: int = Field(
        32 * 1024, gt=0, description="request line and headers; larger get 431"
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="to send a request's headers; slower get 408"
    )
    body_timeout_seconds: float = Field(
        30.0, gt=0, description="to send a request's body once its headers are in; slower get 408"
    )

    # Input and output.
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="larger bodies get 413")
    # Request bytes held while read and parsed (body_budget.py; docs/gateway.md has the arithmetic).
    body_budget_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="request bytes read and held at once on this replica, all tenants together;"
        " a read beyond it waits, then 503 (at least max_body_bytes)",
    )
    body_budget_tenant_bytes: int = Field(
        8 * 1024 * 1024,
        gt=0,
        description="of those, one tenant's at most (less when its max_concurrency x"
        " max_body_bytes is less); a read beyond it waits, then 429",
    )
    body_budget_wait_seconds: float = Field(
        1.0, ge=0, description="how long a read waits for room in the byte budget"
    )
    grpc_message_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="tenant gRPC: to pass the key check, and then to send the request message",
    )
    blocked_terms: list[str] = Field(
        default_factory=list, description="terms filtered out of generated text"
    )
    blocked_terms_action: Literal["mask", "stop"] = Field(
        "mask", description="mask: replace with *; stop: end with finish_reason content_filter"
    )

    # /v1/responses: stored responses (services/gateway/responses/store.py, docs/responses.md).
    responses_database_url: str = Field(
        "sqlite+aiosqlite:///.maas/responses.db",
        description="SQLAlchemy async URL of the stored responses; several gateway replicas"
        " need one shared database (postgresql+asyncpg://...)",
    )
    responses_max_per_tenant: int = Field(
        10_000, ge=1, description="stored responses kept per tenant; the oldest go first"
    )
    responses_max_bytes_per_tenant: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="bytes of stored responses kept per tenant; the oldest go first",
    )
    responses_ttl_seconds: float = Field(
        30 * 24 * 3600.0, gt=0, description="how long a stored response is kept"
    )

    # /v1/files and /v1/batches (services/gateway/batches/, docs/batches.md).
    batches_database_url: str = Field(
        "",
        description="SQLAlchemy async URL of the files' and batches' records; empty = the"
        " stored responses' database. Several gateway replicas need one shared database",
    )
    files_dir: str = Field(
        ".maas/files",
        description="folder of uploaded and batch output files; with several gateway"
        " replicas, one volume they all mount (ReadWriteMany)",
    )
    files_max_file_bytes: int = Field(
        200 * 1024 * 1024, gt=0, description="largest file one upload may be; larger get 413"
    )
    files_max_per_tenant: int = Field(
        100, ge=1, description="uploaded files a tenant may keep; one more gets 413"
    )
    files_max_bytes_per_tenant: int = Field(
        1024 * 1024 * 1024,
        gt=0,
        description="bytes of uploaded files a tenant may keep; an upload past it gets 413",
    )
    files_max_uploads_per_tenant: int = Field(
        2, ge=1, description="uploads one tenant may stream at once per replica; more get 429"
    )
    batch_max_lines: int = Field(
        50_000, ge=1, description="requests in one batch input file (OpenAI's limit)"
    )
    batch_concurrency: int = Field(
        4, ge=0, description="batch lines this replica runs at once (0: no batch worker)"
    )
    batch_lease_seconds: float = Field(
        60.0,
        gt=0,
        description="a claimed line's lease, renewed while it runs; a dead worker's lines"
        " are run again once it passes",
    )
    batch_poll_seconds: float = Field(
        1.0, gt=0, description="how often an idle batch worker looks for lines and batches"
    )
    batch_reserve_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="of a deployment's slots, the share batch lines leave to interactive"
        " requests (at least one slot)",
    )
    batch_max_attempts: int = Field(
        5, ge=1, description="times a line is tried before it ends as an error line"
    )
    batch_quiet_seconds: float = Field(
        1.0,
        ge=0,
        description="a batch line starts only where no interactive request was seen for"
        " this long (0: none in flight is enough; where an engine step's cost hardly grows"
        " with its batch, as on a GPU)",
    )

    # Metrics.
    metrics_tenant_labels: int = Field(
        0,
        ge=0,
        description="tenants named on maas_gateway_tenant_tokens_total (first come, the rest"
        " share _other); 0 = no per-tenant metric",
    )
