from maas_tools.bench.client import RequestResult
from maas_tools.bench.scenarios.shared_prefix import SharedPrefix
from maas_tools.bench.scenarios.uniform_random import UniformRandom


async def record(scenario) -> list[tuple[list[dict], str]]:
    sent = []

    async def send(messages, session="", **_):
        sent.append((messages, session))
        return RequestResult(text=f"answer {len(sent)}")

    await scenario.run(send)
    return sent


async def test_shared_prefix_conversations_grow_and_share_their_groups_prompt():
    scenario = SharedPrefix(groups=2, users_per_group=2, rounds=3, arrival_interval=0)
    sent = await record(scenario)
    assert len(sent) == scenario.total_requests() == 12
    by_session = {}
    for messages, session in sent:
        by_session.setdefault(session, []).append(messages)
    assert len(by_session) == 4
    for session, turns in by_session.items():
        group = int(session.removeprefix("group").split("-")[0])
        assert [len(m) for m in turns] == [2, 4, 6]  # system, then a user+assistant pair a round
        assert all(m[0]["content"] == scenario.system_prompt(group) for m in turns)
        assert turns[2][:4] == turns[1][:4]  # history is resent as it was
    assert scenario.system_prompt(0) != scenario.system_prompt(1)
    assert len(scenario.system_prompt(0).split()) == 1000


async def test_same_seed_same_workload():
    first = await record(SharedPrefix(groups=2, users_per_group=1, rounds=1, arrival_interval=0))
    again = await record(SharedPrefix(groups=2, users_per_group=1, rounds=1, arrival_interval=0))
    assert sorted(str(m) for m, _ in first) == sorted(str(m) for m, _ in again)


async def test_uniform_prompts_share_no_prefix_and_each_is_sent_once():
    scenario = UniformRandom(requests=20, concurrency=6, prompt_tokens=32)
    sent = await record(scenario)
    assert len(sent) == 20
    openings = {messages[0]["content"].split()[0:3].__repr__() for messages, _ in sent}
    assert len(openings) == 20


def summary(ttft: float, hit: float, throughput: float) -> dict:
    return {
        "ttft_s": {"mean": ttft},
        "prefix_cache": {"hit_rate": hit},
        "throughput": {"output_tokens_per_s": throughput},
    }


def test_shared_prefix_verdict_checks_the_issue_targets():
    verdict = SharedPrefix().verdict(
        {"prefix_affinity": summary(0.2, 0.9, 10.0), "round_robin": summary(0.6, 0.2, 9.0)}
    )
    assert verdict["ttft_mean_lower_x"] == {"value": 3.0, "target": ">= 2.5", "met": True}
    assert verdict["prefix_cache_hit_rate_higher_x"]["met"]
    assert verdict["output_throughput_x"]["met"]
    assert SharedPrefix().verdict({"prefix_affinity": summary(1, 1, 1)}) == {}


def test_uniform_verdict_allows_five_percent_worse_and_any_better():
    verdict = UniformRandom().verdict(
        {"prefix_affinity": summary(1.04, 0, 9.6), "least_load": summary(1.0, 0, 10.0)}
    )
    assert verdict["output_throughput_ratio"]["met"] and verdict["ttft_mean_ratio"]["met"]
    worse = UniformRandom().verdict(
        {"prefix_affinity": summary(1.2, 0, 9.0), "least_load": summary(1.0, 0, 10.0)}
    )
    assert not worse["output_throughput_ratio"]["met"] and not worse["ttft_mean_ratio"]["met"]


async def test_shared_prefix_primes_each_groups_prompt_once_unless_cold():
    scenario = SharedPrefix(groups=3)
    sent = []

    async def send(messages, session):
        sent.append(messages[0]["content"])
        return RequestResult()

    await scenario.prepare(send)
    assert sorted(sent) == sorted(scenario.system_prompt(g) for g in range(3))
    sent.clear()
    await SharedPrefix(groups=3, cold_start=True).prepare(send)
    assert sent == []
