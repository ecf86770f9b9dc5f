import random
import statistics

from maas_tools.bench import lengths
from maas_tools.bench.client import RequestResult
from maas_tools.bench.scenarios.chat import Chat
from maas_tools.bench.scenarios.long_prefill_mix import LongPrefillMix


async def record(scenario) -> list[tuple[list[dict], int, str]]:
    sent = []

    async def send(messages, session="", *, max_tokens=0, kind=""):
        sent.append((messages, max_tokens, kind))
        return RequestResult()

    await scenario.run(send)
    return sent


def test_lengths_stay_in_range_and_centre_on_the_geometric_mean():
    rng = random.Random(0)
    drawn = [lengths.draw(rng, 32, 512) for _ in range(2000)]
    assert min(drawn) >= 32 and max(drawn) <= 512
    assert 110 < statistics.median(drawn) < 145  # sqrt(32 * 512) = 128
    uniform = [lengths.draw(rng, 10, 20, "uniform") for _ in range(500)]
    assert set(uniform) == set(range(10, 21))
    assert lengths.draw(rng, 7, 7) == 7


async def test_chat_sends_each_turn_with_its_own_answer_length():
    scenario = Chat(requests=12, request_rate=10_000.0, output_len_range=(4, 40))
    sent = await record(scenario)
    assert len(sent) == 12
    assert {kind for _, _, kind in sent} == {"chat"}
    answers = sorted(max_tokens for _, max_tokens, _ in sent)
    assert answers == sorted(scenario.chat_request(i)[1] for i in range(12))
    assert all(4 <= a <= 40 for a in answers) and len(set(answers)) > 3
    prompts = [len(m[0]["content"].split()) for m, _, _ in sent]
    assert all(32 <= p <= 256 for p in prompts)


def test_chat_workload_repeats_with_its_seed():
    assert Chat(seed=3).chat_request(5) == Chat(seed=3).chat_request(5)
    assert Chat(seed=3).chat_request(5) != Chat(seed=4).chat_request(5)
    assert Chat(seed=3).chat_arrivals() == Chat(seed=3).chat_arrivals()


def test_long_documents_arrive_periodically_while_chat_runs():
    scenario = LongPrefillMix(requests=40, request_rate=2.0, long_every=4.0)
    chat, long = scenario.chat_arrivals(), scenario.long_arrivals()
    assert long == [4.0 * (i + 1) for i in range(len(long))]
    assert long and long[-1] < chat[-1]
    assert scenario.total_requests() == 40 + len(long)
    assert scenario.largest_request_tokens() >= scenario.long_prompt_range[1]


async def test_long_prefill_mix_labels_the_two_classes():
    scenario = LongPrefillMix(
        requests=20, request_rate=1000.0, long_every=0.005, long_prompt_range=(300, 400)
    )
    sent = await record(scenario)
    chat = [s for s in sent if s[2] == "chat"]
    long = [s for s in sent if s[2] == "long"]
    assert len(chat) == 20 and len(long) == len(scenario.long_arrivals()) > 0
    assert len(sent) == scenario.total_requests()
    assert all(max_tokens == scenario.long_max_tokens for _, max_tokens, _ in long)
    assert all(300 <= len(m[0]["content"].split()) - 3 <= 400 for m, _, _ in long)
