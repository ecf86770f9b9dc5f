"""The spool file on its own: order, offsets, torn lines, ownership."""

import time

import pytest
from prometheus_client import REGISTRY

from maas_services.common.usage_event import UsageEvent
from maas_services.gateway.usage.usage_spool import SpoolInUseError, UsageSpool


def event(i: int) -> UsageEvent:
    return UsageEvent(
        request_id=f"r{i}",
        tenant="t",
        model="m",
        prompt_tokens=i,
        completion_tokens=i,
        started_at=time.time(),
    )


def quarantined() -> float:
    return REGISTRY.get_sample_value("maas_gateway_usage_spool_quarantined_total") or 0.0


def ids(batch) -> list[str]:
    return [entry.event.request_id for entry in batch.entries]


async def test_spool_keeps_order_and_resumes_where_replay_stopped(tmp_path):
    spool = UsageSpool.open(tmp_path / "spool")
    assert not spool.has_events()
    for i in range(5):
        await spool.append(event(i))
    assert len(spool) == 5
    batch = spool.next_batch(10)
    assert ids(batch) == [f"r{i}" for i in range(5)]
    spool.commit(batch, 2)
    spool.close()
    # A new gateway process on the same directory resumes at the committed offset.
    again = UsageSpool.open(tmp_path / "spool")
    assert len(again) == 3
    batch = again.next_batch(10)
    assert ids(batch) == ["r2", "r3", "r4"]
    again.commit(batch, 3)
    assert not again.has_events() and len(again) == 0
    assert (tmp_path / "spool" / "usage.jsonl").read_bytes() == b""


async def test_torn_lines_are_quarantined_and_never_glue_onto_the_next_event(tmp_path):
    directory = tmp_path / "spool"
    spool = UsageSpool.open(directory)
    await spool.append(event(0))
    spool.close()
    torn = event(1).model_dump_json()[:17].encode()
    with (directory / "usage.jsonl").open("ab") as file:
        file.write(b"not json\n" + torn)  # a crash mid-write, as ENOSPC leaves it
    before = quarantined()

    spool = UsageSpool.open(directory)
    await spool.append(event(2))
    batch = spool.next_batch(10)
    assert ids(batch) == ["r0", "r2"]
    spool.commit(batch, 2)

    assert quarantined() - before == 2
    assert (directory / "quarantine.jsonl").read_bytes() == b"not json\n" + torn + b"\n"
    assert not spool.has_events()


async def test_a_bad_line_behind_an_unsent_event_is_quarantined_once(tmp_path):
    directory = tmp_path / "spool"
    spool = UsageSpool.open(directory)
    await spool.append(event(0))
    with (directory / "usage.jsonl").open("ab") as file:
        file.write(b"{}\n")
    await spool.append(event(1))
    for _ in range(2):  # Redis refuses the first event twice
        spool.commit(spool.next_batch(10), 0)
    spool.commit(spool.next_batch(10), 2)
    assert (directory / "quarantine.jsonl").read_bytes() == b"{}\n"
    assert not spool.has_events()


def test_a_spool_is_claimed_only_once_its_owner_is_gone(tmp_path):
    directory = tmp_path / "gateway-0"
    owner = UsageSpool.open(directory)
    assert UsageSpool.claim(directory) is None
    owner.close()
    claimer = UsageSpool.claim(directory)
    assert claimer is not None
    assert UsageSpool.claim(directory) is None
    claimer.remove()
    claimer.close()
    assert not directory.exists()


def test_a_second_live_owner_is_refused_with_a_clear_error(tmp_path):
    directory = tmp_path / "gateway-0"
    owner = UsageSpool.open(directory)
    with pytest.raises(SpoolInUseError, match="its own --usage-spool-dir"):
        UsageSpool.open(directory, wait=0.2)
    owner.close()
    UsageSpool.open(directory, wait=0.2).close()
