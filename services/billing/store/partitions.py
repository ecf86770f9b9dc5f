"""Line items are kept by day: one PostgreSQL partition per Unix day of start.

Retention then drops whole days (DROP TABLE of a partition: no row-by-row
delete, no bloat, no vacuum debt), and a day's partition exists before its
first insert: created ahead (today and the next AHEAD_DAYS, by the upkeep
loop) and on demand for an event's day. Which days may be written at all is
`Window`'s decision: an event that started before the retention (its dedup
row may already be gone) or more than a day in the future (a clock gone
wrong, or a forged event) is refused by the ledger, never given a partition.

SQLite (`maas up`'s embedded store) has no partitions: its day column is an
ordinary indexed column and retention deletes by day range, which is fine at
one laptop's traffic.
"""

import re
import time
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from maas_services.common.logging import get_logger

log = get_logger(__name__)

DAY = 86400
AHEAD_DAYS = 3
# Held by the transaction creating partitions, so two replicas do not race on
# the catalog (CREATE TABLE IF NOT EXISTS is not safe against a concurrent one).
PARTITION_LOCK = 7_370_002
_NAME = re.compile(r"^line_items_d(\d+)$")


def day_of(when: float) -> int:
    return int(when // DAY)


@dataclass(frozen=True)
class Window:
    """The days an event may start on to be billed, from the retention."""

    keep_seconds: int

    def refusal(self, started_at: float, now: float | None = None) -> str | None:
        """Why an event that started then is refused, or None."""
        now = time.time() if now is None else now
        if started_at < now - self.keep_seconds:
            return "too_old"
        if started_at > now + DAY:
            return "future"
        return None


def partition_name(day: int) -> str:
    return f"line_items_d{day}"


class Partitions:
    """Creates and drops line_items' day partitions (PostgreSQL; no-ops on SQLite
    but for retention's delete)."""

    def __init__(self) -> None:
        self._known: set[int] = set()

    def unknown(self, days: set[int]) -> set[int]:
        """The days not known to have a partition."""
        return days - self._known

    async def ensure(self, conn: AsyncConnection, days: set[int]) -> None:
        """Make sure each day has its partition (own transaction: the caller commits)."""
        if conn.dialect.name != "postgresql":
            return
        missing = self.unknown(days)
        if not missing:
            return
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PARTITION_LOCK})
        existing = await self.existing(conn)
        for day in sorted(missing - existing):
            await conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS {partition_name(day)} PARTITION OF line_items "
                    f"FOR VALUES FROM ({day}) TO ({day + 1})"
                )
            )
            log.info("line_item_partition_created", day=day, name=partition_name(day))
        self._known |= existing | missing

    async def existing(self, conn: AsyncConnection) -> set[int]:
        rows = await conn.execute(
            text(
                "SELECT c.relname FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'line_items'"
            )
        )
        return {int(m.group(1)) for (name,) in rows if (m := _NAME.match(name))}

    async def drop_before(self, conn: AsyncConnection, day: int) -> int:
        """Remove every line item of a day before `day`; how many days (PG) or rows (SQLite)."""
        if conn.dialect.name != "postgresql":
            result = await conn.execute(text("DELETE FROM line_items WHERE day < :d"), {"d": day})
            return result.rowcount
        old = sorted(d for d in await self.existing(conn) if d < day)
        for d in old:
            await conn.execute(text(f"DROP TABLE IF EXISTS {partition_name(d)}"))
            log.info("line_item_partition_dropped", day=d, name=partition_name(d))
        self._known -= set(old)
        return len(old)
