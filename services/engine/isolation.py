"""Find the items of a batch that make a batched call raise, by bisection.

A batched call that raises says nothing about which item caused it. Running
the halves separately, and the halves of any half that still raises, ends
with every item either inside a part that succeeded or failing on its own:
with one bad item among b that is about 2 log2(b) extra calls, against b for
trying each item alone, and a failure that only a combination causes (the
whole batch too large for memory, say) just ends with the batch run in parts.
The call must be safe to repeat on a subset: whatever a failed attempt wrote
must be rewritten or ignored by the attempts that follow (llm_engine.py says
why that holds for the model step).
"""

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def bisect_failures(
    items: Sequence[T], run: Callable[[list[T]], R]
) -> tuple[list[tuple[list[T], R]], list[tuple[T, Exception]]]:
    """Run `run` over items, splitting on failure.

    Returns the parts that ran, in item order, with their results, and each
    item that raised on its own, with its exception.
    """
    parts: list[tuple[list[T], R]] = []
    failures: list[tuple[T, Exception]] = []
    pending = [list(items)]
    while pending:
        batch = pending.pop()
        try:
            parts.append((batch, run(batch)))
        except Exception as exc:
            if len(batch) == 1:
                failures.append((batch[0], exc))
            else:
                middle = len(batch) // 2
                # Popped last first, so the parts come out in item order.
                pending += [batch[middle:], batch[:middle]]
    return parts, failures
