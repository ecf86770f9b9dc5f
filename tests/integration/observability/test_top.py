"""`maas top --once` against the running stack: one frame, as text."""

import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from maas_services.common.model_files import DEFAULT_MODEL_ID
from maas_tools.local.dev_tenant import DEV_TENANT

pytestmark = pytest.mark.slow


def billed_requests(url: str) -> float:
    families = text_string_to_metric_families(httpx.get(url, timeout=10).text)
    return sum(
        s.value
        for f in families
        for s in f.samples
        if s.name == "maas_billing_tenant_requests_total"
    )


def test_once_prints_replicas_gateway_and_tenants(stack):
    billing = stack.metrics_urls["billing"]
    before = billed_requests(billing)
    client = openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.api_key)
    for _ in client.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        stream=True,
    ):
        pass
    deadline = time.monotonic() + 15
    while billed_requests(billing) == before and time.monotonic() < deadline:
        time.sleep(0.2)

    frame = subprocess.run(
        [sys.executable, "-m", "maas_tools.cli", "top", "--once", "--interval", "0.5"]
        + ["--state-dir", str(stack.config.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout

    lines = [line.split() for line in frame.splitlines() if line.strip()]
    # The first row a name heads: the replica table comes before the local processes.
    rows: dict[str, list[str]] = {}
    for cells in lines:
        rows.setdefault(cells[0], cells)
    assert ["billing", "0"] in lines  # the local processes table: no restarts
    _, state, _, _, kv, tokens_per_s, p50, p99 = rows["engine-0"]
    assert state == "ready"
    assert kv.endswith("%") and float(tokens_per_s) >= 0
    assert p50 != "-" and p99 != "-"
    assert rows[DEFAULT_MODEL_ID][1] == "1/1"
    tenant = rows[DEV_TENANT]
    assert int(tenant[1]) >= 1 and int(tenant[4]) >= 1  # requests, completion tokens
