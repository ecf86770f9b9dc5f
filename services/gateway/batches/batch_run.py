"""A batch line's Run: the interactive Run (run.py), at the lowest engine priority,
billed as a batch line under an id derived from (batch, line[, input]).

The pipeline admits a line as it admits an interactive request of the batch's
tenant (limits, quota, fair queue) and returns a Run; BatchRun takes that Run
over before a delta is read (so the Run it replaces never starts and never
ends anything) and changes two things:
- the engine priority: below every tier's, so an engine serves interactive
  sequences first and preempts a batch line's first (scheduler.py);
- the usage event: `request_id` is `batch_<id>:<line>` (an embeddings
  line's inputs: `batch_<id>:<line>:<input index>`) and `started_at` the
  line's first claim (stored with the line), so a line run again after its
  worker died is the same event to billing, whose dedup is by (request_id,
  day): it is billed once (each input of an embeddings line once).
  `batch_id` says it is a batch line, which billing prices at the batch
  price (services/common/prices.py).
"""

from dataclasses import dataclass, field, replace

from maas_services.common.usage_event import UsageEvent
from maas_services.gateway.run import Run
from maas_services.gateway.upstream.engine_client import Tally

# Below every tier's priority (routing_table.DEFAULT_TIERS start at 0).
BATCH_PRIORITY = -100


def usage_id(batch_id: str, line: int, index: int | None = None) -> str:
    """A line's usage event id; an embeddings line bills each input under its index."""
    return f"{batch_id}:{line}" if index is None else f"{batch_id}:{line}:{index}"


@dataclass
class BatchRun(Run):
    batch_id: str = field(kw_only=True)
    line: int = field(kw_only=True)
    started_at: float = field(kw_only=True)
    # The input's index in an embeddings line; None for a line of one request.
    index: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        route = self.ticket.route
        self.ticket.route = replace(
            route, tier=route.tier.model_copy(update={"priority": BATCH_PRIORITY})
        )

    @classmethod
    def taking_over(
        cls, run: Run, batch_id: str, line: int, started_at: float, index: int | None = None
    ) -> "BatchRun":
        return cls(
            run.ticket,
            run.engine,
            run.output_filter,
            run.limiter,
            run.usage,
            run.background,
            batch_id=batch_id,
            line=line,
            started_at=started_at,
            index=index,
        )

    def _event(self, tally: Tally) -> UsageEvent:
        return (
            super()
            ._event(tally)
            .model_copy(
                update={
                    "request_id": usage_id(self.batch_id, self.line, self.index),
                    "started_at": self.started_at,
                    "batch_id": self.batch_id,
                }
            )
        )

    async def _bill(self) -> None:
        """A line cut short (its worker stopped, its engine failed) bills nothing: it
        runs again and is billed then, once, or ends as an error line."""
        if self._stream is not None:
            tally = await self._stream.tally()
            if tally is None or not tally.finish:
                self._stream = None  # Run._bill: nothing to bill, tokens settled to 0
        await super()._bill()
