"""429 carries Retry-After and the error envelope, where the server limits at all.

Probed only when asked (--rate-limit-probe N): waves of cheap requests
(max_tokens 1), at most N in all, stopping at the first 429. No 429 within N
requests: the server does not limit this key that tightly, "not offered".
Retry-After is seconds or an HTTP date (RFC 9110 10.2.3); OpenAI sends it with
its x-ratelimit-* headers.
"""

from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime

import httpx

from maas_tools.conformance.registry import check
from maas_tools.conformance.result import NotOffered, expect
from maas_tools.conformance.shapes import ask, envelope
from maas_tools.conformance.target import Target

WAVE = 8


def retry_after_valid(value: str) -> bool:
    if value.strip().isdigit():
        return True
    try:
        parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return False
    return True


@check("rate_limit", "retry_after")
def retry_after(target: Target) -> str:
    budget = target.options.rate_limit_probe
    if budget <= 0:
        raise NotOffered("not probed (--rate-limit-probe N sends at most N requests)")
    key = target.options.rate_limit_key or target.options.key
    payload = target.body(messages=ask("Hi"), max_tokens=1)
    with (
        httpx.Client(
            base_url=target.base_url,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=target.options.timeout,
        ) as http,
        ThreadPoolExecutor(WAVE) as pool,
    ):
        sent = 0
        while sent < budget:
            size = min(WAVE, budget - sent)
            replies = list(
                pool.map(lambda _: http.post("/chat/completions", json=payload), range(size))
            )
            sent += size
            limited = [r for r in replies if r.status_code == 429]
            if limited:
                reply = limited[0]
                value = reply.headers.get("retry-after")
                expect(value is not None, "a 429 without a Retry-After header")
                expect(retry_after_valid(value), f"Retry-After is seconds or a date, got {value!r}")
                envelope(reply, "429")
                return f"429 after {sent} requests, Retry-After {value}"
    raise NotOffered(f"no 429 within {budget} requests")
