"""The adapter bound's age limit (issue #34): a request for an adapter beyond
max_loras is admitted within ADAPTER_WAIT_STEPS steps plus the time the running
requests of one adapter take to end, however steadily the running adapters are
asked for; nothing is preempted for it and the base is never held back."""

from maas_services.engine.block_manager import BlockManager
from maas_services.engine.scheduler import ADAPTER_WAIT_STEPS, Scheduler, SchedulerConfig
from maas_services.engine.sequence import Sequence
from tests.unit.engine.test_scheduler import BLOCK, complete_step, live, seq

MAX_LORAS = 8
HOT = [f"hot{i}" for i in range(MAX_LORAS)]
NEW_TOKENS = 6  # every request ends after this many tokens
PROMPT = 3


class Load:
    """A scheduler driven as the engine drives it, with one new request for each hot
    adapter and one for the base arriving every step."""

    def __init__(self):
        # Room for every request the test makes: nothing is preempted for lack of blocks.
        self.sched = Scheduler(
            SchedulerConfig(max_num_seqs=1024), BlockManager(8192, BLOCK), MAX_LORAS
        )
        self.step_no = 0
        self.admitted_at: dict[str, int] = {}
        self.arrived_at: dict[str, int] = {}

    def add(self, request_id: str, adapter: str) -> Sequence:
        s = seq(request_id, PROMPT, arrival=self.step_no)
        s.adapter = adapter
        self.arrived_at[request_id] = self.step_no
        self.sched.add(s)
        return s

    def step(self) -> None:
        for adapter in HOT:
            self.add(f"{adapter}-{self.step_no}", adapter)
        self.add(f"base-{self.step_no}", "")
        out = self.sched.schedule()
        assert not out.preempted
        for s in out.admitted:
            self.admitted_at[s.request_id] = self.step_no
        assert len({s.adapter for s in self.sched.running if s.adapter}) <= MAX_LORAS
        complete_step(self.sched, out)
        for s in list(self.sched.running):
            if len(s.output_ids) == NEW_TOKENS:
                self.sched.finish(s, "length")
        self.sched.blocks.check_invariants(live(self.sched))
        self.step_no += 1


def test_a_ninth_adapter_is_admitted_within_the_bound_under_a_steady_stream():
    load = Load()
    for _ in range(NEW_TOKENS):  # the hot adapters fill the step's adapter slots
        load.step()
    load.add("cold", "cold")
    arrived = load.step_no
    for _ in range(ADAPTER_WAIT_STEPS):
        load.step()
    # Until the bound, first come first served is as before: the slots stay taken.
    assert "cold" not in load.admitted_at
    for _ in range(NEW_TOKENS + 1):
        load.step()
    # The hold stops new requests of the hot adapters; their running ones end within
    # NEW_TOKENS steps and the first adapter to empty frees its slot.
    assert load.admitted_at["cold"] - arrived <= ADAPTER_WAIT_STEPS + NEW_TOKENS
    # The base requests were admitted the step they arrived, throughout.
    for request_id, step in load.arrived_at.items():
        if request_id.startswith("base-"):
            assert load.admitted_at[request_id] == step, request_id
    # And the hot adapters are admitted again once the cold one is in.
    assert any(load.admitted_at.get(f"{adapter}-{load.step_no - 2}") is not None for adapter in HOT)
    assert all(s.num_preemptions == 0 for s in live(load.sched))


def test_many_new_adapters_at_once_are_admitted_one_after_another():
    """The worst case: as many cold adapters as slots, a request each, all at once,
    behind a steady stream for the hot ones. Each waits at most the bound and one
    drain after the one before it; the base runs unaffected all along."""
    load = Load()
    for _ in range(NEW_TOKENS):
        load.step()
    cold = [f"cold{i}" for i in range(MAX_LORAS)]
    for adapter in cold:
        load.add(adapter, adapter)
    previous = load.step_no
    for adapter in cold:
        for _ in range(ADAPTER_WAIT_STEPS + NEW_TOKENS + 2):
            if adapter in load.admitted_at:
                break
            load.step()
        # In arrival order, each within the bound and one drain of the one before.
        assert load.admitted_at[adapter] - previous <= ADAPTER_WAIT_STEPS + NEW_TOKENS + 1
        previous = load.admitted_at[adapter]
    for request_id, step in load.arrived_at.items():
        if request_id.startswith("base-"):
            assert load.admitted_at[request_id] == step, request_id
    assert all(s.num_preemptions == 0 for s in live(load.sched))
