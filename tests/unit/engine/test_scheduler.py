"""Scheduling decisions, with the real block manager and no model."""

import torch

from maas_services.engine.block_manager import BlockManager
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from maas_services.engine.sequence import Sequence, SequenceStatus

BLOCK = 4


def seq(name: str, prompt_len: int, priority: int = 0, arrival: float = 0.0) -> Sequence:
    return Sequence(
        request_id=name,
        index=0,
        token_ids=list(range(100, 100 + prompt_len)),
        num_prompt_tokens=prompt_len,
        params=SamplingParams(),
        generator=torch.Generator(),
        priority=priority,
        arrival_time=arrival,
    )


def scheduler(blocks=64, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), BlockManager(blocks, BLOCK))


def complete_step(sched: Scheduler, out: SchedulerOutput, token: int = 7) -> None:
    """What the engine does after the model ran: advance, and sample where due."""
    for item in out.scheduled:
        samples = item.samples
        item.seq.num_computed_tokens += item.num_new_tokens
        sched.blocks.mark_computed(item.seq, item.seq.num_computed_tokens)
        if samples:
            item.seq.token_ids.append(token)


def planned(out: SchedulerOutput) -> dict[str, int]:
    return {item.seq.request_id: item.num_new_tokens for item in out.scheduled}


def live(sched: Scheduler) -> list[Sequence]:
    return [*sched.running, *sched.waiting]


def test_long_prompt_is_chunked_and_shares_steps_with_decodes():
    sched = scheduler(max_num_batched_tokens=16)
    sched.add(seq("short", 3))
    complete_step(sched, sched.schedule())  # short prefilled, now decoding
    sched.add(seq("long", 40))
    steps = []
    while any(s.request_id == "long" and s.num_uncomputed_tokens > 1 for s in live(sched)):
        out = sched.schedule()
        steps.append(planned(out))
        assert out.num_tokens <= 16
        complete_step(sched, out)
        sched.blocks.check_invariants(live(sched))
    assert all(step["short"] == 1 for step in steps), "the decode ran in every step"
    assert [step["long"] for step in steps] == [15, 15, 10]


def test_without_chunking_a_prompt_waits_for_a_whole_budget():
    sched = scheduler(max_num_batched_tokens=16, enable_chunked_prefill=False)
    sched.add(seq("short", 3))
    complete_step(sched, sched.schedule())
    sched.add(seq("long", 40))
    out = sched.schedule()
    assert planned(out) == {"short": 1}
    complete_step(sched, out)


def test_priority_then_arrival_order_for_admission():
    sched = scheduler(max_num_seqs=2)
    sched.add(seq("late-low", 3, priority=0, arrival=2))
    sched.add(seq("early-low", 3, priority=0, arrival=1))
    sched.add(seq("high", 3, priority=5, arrival=3))
    assert list(planned(sched.schedule())) == ["high", "early-low"]


def test_max_num_seqs_caps_the_batch():
    sched = scheduler(max_num_seqs=3)
    for i in range(5):
        sched.add(seq(f"r{i}", 2, arrival=i))
    assert len(sched.schedule().scheduled) == 3
    assert len(sched.waiting) == 2


def test_out_of_blocks_preempts_lowest_priority_newest():
    # 6 blocks of 4: three sequences of 8 tokens fill it; the next decode needs a block.
    sched = scheduler(blocks=6, max_num_batched_tokens=64)
    sched.add(seq("vip", 8, priority=1, arrival=3))
    sched.add(seq("old", 8, arrival=1))
    sched.add(seq("new", 8, arrival=2))
    complete_step(sched, sched.schedule())
    out = sched.schedule()
    assert [s.request_id for s in out.preempted] == ["new"]
    assert set(planned(out)) == {"vip", "old"}
    victim = sched.waiting[0]
    assert victim.status is SequenceStatus.WAITING
    assert victim.num_computed_tokens == 0 and victim.block_table == []
    assert victim.num_tokens == 9, "generated tokens are kept, to be recomputed"
    complete_step(sched, out)
    sched.blocks.check_invariants(live(sched))


def test_prefix_cache_hit_skips_computed_blocks():
    sched = scheduler()
    first = seq("first", 10)
    sched.add(first)
    complete_step(sched, sched.schedule())
    sched.finish(first, "stop")
    again = seq("again", 10)
    sched.add(again)
    out = sched.schedule()
    assert again.num_cached_tokens == 8
    assert planned(out) == {"again": 2}
    assert out.admitted == [again]


def test_finish_and_abort_free_blocks():
    sched = scheduler()
    a, b = seq("a", 6), seq("b", 6)
    sched.add(a)
    sched.add(b)
    complete_step(sched, sched.schedule())
    sched.finish(a, "stop")
    sched.finish(b, "abort")
    assert not sched.has_work
    assert sched.blocks.num_used_blocks == 0
    sched.blocks.check_invariants([])
