import time

from services.common.usage_event import UsageEvent
from services.gateway.usage_spool import UsageSpool


def event(i: int) -> UsageEvent:
    return UsageEvent(
        request_id=f"r{i}",
        tenant="t",
        model="m",
        prompt_tokens=i,
        completion_tokens=i,
        started_at=time.time(),
    )


async def test_spool_keeps_order_and_drops_only_what_was_sent(tmp_path):
    spool = UsageSpool(tmp_path / "spool")
    assert not spool.has_events()
    for i in range(5):
        await spool.append(event(i))
    assert len(spool) == 5
    # A new gateway process on the same directory sees the same events.
    again = UsageSpool(tmp_path / "spool")
    assert [e.request_id for e in again.read()] == [f"r{i}" for i in range(5)]
    again.drop_first(2)
    assert [e.request_id for e in spool.read()] == ["r2", "r3", "r4"]
    spool.drop_first(3)
    assert not spool.has_events() and len(spool) == 0
