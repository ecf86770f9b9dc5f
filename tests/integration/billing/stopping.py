"""Stopping a test's consumer or trimmer before the test ends."""

import asyncio


async def stopped(*tasks: asyncio.Task) -> None:
    """Cancel the tasks and wait until they have ended. A task only cancelled could
    still be running into the next test on the session's event loop (redis-py may swallow
    a cancel, which the loop honours at its next pass): a consumer group of an earlier test
    then reads the next test's events and adds them to Redis's running totals, so that
    test's ledger check finds Redis ahead of its database."""
    for task in tasks:
        task.cancel()
    # A hang guard, not a timing claim: a cancel swallowed for ever would hang the suite.
    done, _ = await asyncio.wait(tasks, timeout=30)
    assert len(done) == len(tasks), "a task did not stop within 30 s of its cancel"
