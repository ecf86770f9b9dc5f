"""The database's chores, on a timer: the outbox, partitions ahead, retention.

Every `interval` seconds (and once at start) one round:
  * applies outbox rows older than `outbox_grace` seconds: batches a replica
    committed but did not get into Redis (it died, or Redis failed it), so a
    dead replica's last batch reaches the running totals within a minute
    even if nothing restarts it (ledger.py);
  * creates line_items' partitions for today and the next days
    (store/partitions.py), so a day's first insert does not wait for DDL;
  * drops what is past its retention: whole days of line items, rollup rows.
Supervised like the consumer: a failed round is logged, counted in
maas_billing_upkeep_failures_total and retried with the same backoff.
"""

import time

from prometheus_client import Counter, Gauge
from tenacity import RetryCallState

from maas_services.billing.ledger import Ledger
from maas_services.billing.periodic import every
from maas_services.common.logging import get_logger

log = get_logger(__name__)

FAILURES = Counter("maas_billing_upkeep_failures", "Upkeep rounds that failed", ["error"])
RECOVERED = Counter(
    "maas_billing_outbox_recovered_batches",
    "Committed batches applied to Redis by the upkeep loop, not by their consumer",
)
UNAPPLIED = Gauge(
    "maas_billing_outbox_batches", "Committed batches whose effects Redis does not have yet"
)


class Upkeep:
    def __init__(self, ledger: Ledger, interval: float = 60.0, outbox_grace: float = 30.0):
        self._ledger = ledger
        self._interval = interval
        self._grace = outbox_grace
        self._schema_ready = False

    async def round(self) -> None:
        store, keep, now = self._ledger.store, self._ledger.retention, time.time()
        if not self._schema_ready:  # the consumer may not have created it yet
            await store.start()
            self._schema_ready = True
        RECOVERED.inc(await self._ledger.recover(older_than=self._grace))
        UNAPPLIED.set(await store.unapplied())
        await store.ensure_partitions_ahead()
        await store.expire(
            line_items_before=now - keep.line_items,
            hours_before=now - keep.hourly,
            days_before=now - keep.daily,
        )

    async def run(self) -> None:
        """A round every interval until cancelled; no failure ends it."""
        await every(self._interval, self.round, _failed)


def _failed(state: RetryCallState) -> None:
    error = state.outcome.exception()
    FAILURES.labels(type(error).__name__).inc()
    log.warning(
        "billing_upkeep_failed",
        error=str(error),
        error_type=type(error).__name__,
        attempt=state.attempt_number,
        retry_in_seconds=round(state.upcoming_sleep, 2),
    )
