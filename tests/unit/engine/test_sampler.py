from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch

from maas_services.engine import sampler as sampler_module
from maas_services.engine.sampler import Sampler, make_generator
from maas_services.engine.sampling_params import SamplingParams

EOS = 2
VOCAB = 50
HIDDEN = 16  # the model width an embedding request is checked against


@dataclass
class Request:
    params: SamplingParams
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    generator: torch.Generator = field(init=False)
    grammar: None = None

    def __post_init__(self):
        self.generator = make_generator(self.params.seed)


sampler = Sampler([EOS])


def random_logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def logits_with(values: dict[int, float]) -> torch.Tensor:
    """Logits of -10 except at the given token ids."""
    logits = torch.full((VOCAB,), -10.0)
    for token, value in values.items():
        logits[token] = value
    return logits


def draw(logits: torch.Tensor, params: SamplingParams, n: int = 200, **request) -> set[int]:
    """The tokens n draws give, each at the next position of one sequence (a
    seeded draw depends on its position: sampler.position_seed)."""
    req = Request(params, **request)
    drawn = set()
    for _ in range(n):
        token = sampler(logits, [req])[0]
        drawn.add(token)
        req.output_ids = [*req.output_ids, token]
    return drawn


def test_greedy_is_argmax_for_every_row():
    logits = random_logits(rows=4)
    requests = [Request(SamplingParams(temperature=0)) for _ in range(4)]
    assert sampler(logits, requests) == logits.argmax(-1).tolist()


def test_accepts_a_single_vocab_row():
    logits = random_logits()[0]
    assert sampler(logits, [Request(SamplingParams(temperature=0))]) == [int(logits.argmax())]


def test_does_not_modify_the_callers_logits():
    logits = random_logits()
    before = logits.clone()
    sampler(
        logits,
        [Request(SamplingParams(repetition_penalty=2, top_p=0.5, min_p=0.1), prompt_ids=[1, 2, 3])],
    )
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [0.1, 1.0, 5.0, 100.0])
def test_top_k_1_is_greedy_at_any_temperature(temperature):
    logits = random_logits(rows=3, seed=1)
    requests = [Request(SamplingParams(temperature=temperature, top_k=1, seed=i)) for i in range(3)]
    for _ in range(20):
        assert sampler(logits, requests) == logits.argmax(-1).tolist()


def sample_run(seed: int | None, steps: int = 30) -> list[int]:
    request = Request(SamplingParams(temperature=1.0, seed=seed))
    logits = torch.zeros(VOCAB)  # uniform: every draw is up to the generator
    for _ in range(steps):
        request.output_ids.append(sampler(logits, [request])[0])
    return request.output_ids


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    assert sample_run(seed=7) == sample_run(seed=7)
    assert sample_run(seed=7) != sample_run(seed=8)


def test_unseeded_requests_differ():
    assert sample_run(seed=None) != sample_run(seed=None)


def test_a_request_samples_the_same_alone_or_in_a_batch():
    logits = random_logits(rows=3, seed=2)
    alone = Request(SamplingParams(seed=5))
    batched = [
        Request(SamplingParams(seed=11)),
        Request(SamplingParams(seed=5)),
        Request(SamplingParams()),
    ]
    for _ in range(20):
        assert sampler(logits[1], [alone]) == sampler(logits, batched)[1:2]


def test_min_tokens_suppresses_eos_and_stop_token_ids_until_reached():
    logits = logits_with({2: 10.0, 7: 9.0, 3: 5.0})
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[7])
    assert draw(logits, params, n=1, output_ids=[4]) == {3}
    assert draw(logits, params, n=1, output_ids=[4, 4]) == {EOS}


def test_ignore_eos_always_suppresses_eos_but_not_stop_token_ids():
    logits = logits_with({2: 10.0, 7: 9.0})
    params = SamplingParams(temperature=0, ignore_eos=True, stop_token_ids=[7])
    assert draw(logits, params, n=1, output_ids=list(range(20))) == {7}


def test_repetition_penalty_divides_seen_positive_logits():
    logits = logits_with({5: 2.0, 6: 1.5})
    assert draw(logits, SamplingParams(temperature=0), n=1, prompt_ids=[5]) == {5}
    assert draw(
        logits, SamplingParams(temperature=0, repetition_penalty=2.0), n=1, prompt_ids=[5]
    ) == {6}
    assert draw(
        logits, SamplingParams(temperature=0, repetition_penalty=2.0), n=1, output_ids=[5]
    ) == {6}


def test_repetition_penalty_multiplies_seen_negative_logits():
    logits = logits_with({5: -1.0, 6: -1.5})
    assert draw(
        logits, SamplingParams(temperature=0, repetition_penalty=2.0), n=1, prompt_ids=[5]
    ) == {6}


def test_presence_penalty_applies_to_output_tokens_only():
    logits = logits_with({5: 2.0, 6: 1.5})
    params = SamplingParams(temperature=0, presence_penalty=1.0)
    assert draw(logits, params, n=1, prompt_ids=[5]) == {5}
    assert draw(logits, params, n=1, output_ids=[5]) == {6}


def test_frequency_penalty_grows_with_count_and_presence_does_not():
    logits = logits_with({5: 3.0, 6: 2.5})
    output = [5, 5, 5, 6]
    assert draw(
        logits, SamplingParams(temperature=0, presence_penalty=0.5), n=1, output_ids=output
    ) == {5}
    assert draw(
        logits, SamplingParams(temperature=0, frequency_penalty=0.5), n=1, output_ids=output
    ) == {6}


def three_token_logits(p0: float, p1: float, p2: float) -> torch.Tensor:
    logits = torch.full((VOCAB,), float("-inf"))
    logits[:3] = torch.tensor([p0, p1, p2]).log()
    return logits


def test_top_k_keeps_the_k_most_likely():
    assert draw(three_token_logits(0.4, 0.35, 0.25), SamplingParams(top_k=2, seed=0)) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = three_token_logits(0.5, 0.3, 0.2)
    assert draw(logits, SamplingParams(top_p=0.5, seed=0)) == {0}
    assert draw(logits, SamplingParams(top_p=0.7, seed=0)) == {0, 1}
    assert draw(logits, SamplingParams(top_p=1.0, seed=0)) == {0, 1, 2}


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    logits = three_token_logits(0.6, 0.3, 0.1)
    assert draw(logits, SamplingParams(min_p=0.2, seed=0)) == {0, 1}


def test_temperature_flattens_and_sharpens():
    logits = three_token_logits(0.9, 0.09, 0.01)
    assert 2 in draw(logits, SamplingParams(temperature=5.0, seed=0))
    assert draw(logits, SamplingParams(temperature=0.05, seed=0)) == {0}


def test_default_params_are_valid():
    SamplingParams().validate(VOCAB, HIDDEN)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("top_k", VOCAB + 1),
        ("min_p", -0.1),
        ("min_p", 1.1),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        # A positive logit divided by it overflows to inf: NaN probabilities.
        ("repetition_penalty", 1e-40),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3.0),
        ("seed", 2**64),
        ("seed", -1),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("min_tokens", 17),  # above the default max_tokens of 16
        ("stop", [""]),
        ("stop", ["x" * 257]),
        ("stop", ["x"] * 17),
        ("stop_token_ids", [-1]),
        # min_tokens bans stop ids by indexing the logits with them.
        ("stop_token_ids", [VOCAB]),
        ("stop_token_ids", list(range(257))),
        ("top_logprobs", 21),
    ],
)
def test_validate_rejects_and_names_the_field(name, value):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: value}).validate(VOCAB, HIDDEN)


def test_top_logprobs_cannot_exceed_the_vocabulary():
    with pytest.raises(ValueError, match="top_logprobs must be in \\[0, 5\\]"):
        SamplingParams(top_logprobs=6).validate(5, HIDDEN)


def test_a_long_rejected_value_is_not_echoed_whole():
    with pytest.raises(ValueError) as caught:
        SamplingParams(stop=["x" * 100_000]).validate(VOCAB, HIDDEN)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize("seed", [0, 2**64 - 1])
def test_every_sample_of_any_seed_gets_a_distinct_valid_stream(seed):
    params = SamplingParams(seed=seed, n=16)
    params.validate(VOCAB, HIDDEN)
    seeds = [params.sample_seed(i) for i in range(params.n)]
    assert len(set(seeds)) == 16
    for s in seeds:
        make_generator(s)


def _ops(run) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return [event.name for event in profile.events()]


def test_greedy_rows_add_no_ops_to_a_batch():
    # What a step costs must not grow op by op with its greedy rows: the
    # batch's argmax is one op (one transfer to the host), and EOS banned by
    # ignore_eos is one indexed write for every row; only the sampled row
    # has work of its own.
    def batch(greedy_rows: int) -> list[Request]:
        greedy = SamplingParams(temperature=0, ignore_eos=True)
        return [*(Request(greedy) for _ in range(greedy_rows)), Request(SamplingParams(seed=3))]

    three, seven = random_logits(rows=4), random_logits(rows=8)
    assert Counter(_ops(lambda: sampler(seven, batch(7)))) == Counter(
        _ops(lambda: sampler(three, batch(3)))
    )
    banned = seven.clone()
    banned[:, EOS] = float("-inf")
    assert sampler(seven, batch(7))[:7] == banned.argmax(-1).tolist()[:7]


def test_samples_the_models_inference_tensors_outside_inference_mode():
    # Speculative verification hands the sampler rows of the step's logits,
    # made under inference_mode, from outside it.
    with torch.inference_mode():
        logits = random_logits(rows=2)
    params = SamplingParams(temperature=0.7, ignore_eos=True, repetition_penalty=1.3, seed=1)
    request = Request(params, prompt_ids=[1, 3])
    before = logits.clone()
    probs, argmax = sampler.distribution(logits[0], request)
    assert probs[EOS] == 0 and argmax != EOS
    assert sampler(logits, [request, Request(SamplingParams(temperature=0))])[1] == int(
        before[1].argmax()
    )
    assert torch.equal(logits, before)


def test_a_banned_argmax_moves_only_its_own_greedy_row():
    # Greedy rows skip the masking unless a row's argmax is banned: then the whole
    # batch takes the masked path, and every row still gets its own answer.
    logits = random_logits(rows=6, seed=4)
    logits[[1, 4], EOS] = 100.0
    params = SamplingParams(temperature=0, ignore_eos=True)
    free = SamplingParams(temperature=0)
    requests = [Request(params if i != 4 else free) for i in range(6)]
    banned = logits.clone()
    banned[[0, 1, 2, 3, 5], EOS] = float("-inf")
    assert sampler(logits, requests) == banned.argmax(-1).tolist()
    assert sampler(logits, requests)[4] == EOS


def test_a_seeded_draw_depends_on_its_seed_and_position_only():
    """What lets a migrated request continue its seeded sequence on another replica."""
    whole = sample_run(seed=7)
    resumed = Request(SamplingParams(temperature=1.0, seed=7), output_ids=whole[:12])
    logits = torch.zeros(VOCAB)
    for _ in range(len(whole) - 12):
        resumed.output_ids.append(sampler(logits, [resumed])[0])
    assert resumed.output_ids == whole


def test_a_draw_follows_the_weights_and_never_lands_on_a_zero():
    weights = torch.tensor([0.0, 1.0, 0.0, 0.0, 3.0, 0.0])  # any total, zeros at both ends
    generator = torch.Generator().manual_seed(0)
    counts = Counter(sampler_module.draw(weights, generator) for _ in range(4000))
    assert set(counts) == {1, 4}
    # 1,000 expected for token 1 (binomial sd ~27): five sd either side.
    assert 865 < counts[1] < 1135


def reference_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens top-p keeps, by the whole vocabulary's ranking."""
    ranked, order = logits.softmax(-1).sort(descending=True)
    kept = torch.zeros_like(logits, dtype=torch.bool)
    kept[order[ranked.cumsum(-1) - ranked < top_p]] = True
    return kept


def long_tail(vocab: int = 4000) -> torch.Tensor:
    """Logits whose 16 most likely tokens hold little of the mass: the floor must drop."""
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(5)) * 0.3
    logits[:16] += 2.0
    logits[::7] = float("-inf")  # masked tokens (banned, cut by top-k) never come back
    return logits


@pytest.mark.parametrize(
    "logits",
    [
        pytest.param(
            torch.randn(2000, generator=torch.Generator().manual_seed(3)) * 4, id="peaked"
        ),
        pytest.param(long_tail(), id="long_tail"),
        pytest.param(torch.zeros(600), id="flat"),
    ],
)
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99, 0.999999])
def test_top_p_from_a_prefix_of_the_ranking_keeps_what_the_whole_ranking_keeps(
    monkeypatch, logits, top_p
):
    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", 16)
    kept_ids = sampler_module._kept(logits.clone(), SamplingParams(top_p=top_p))
    kept = torch.zeros_like(logits, dtype=torch.bool).index_fill_(0, kept_ids, True)
    assert torch.equal(kept, reference_top_p(logits, top_p))


@pytest.mark.parametrize("candidates", [16, sampler_module.TOP_P_CANDIDATES])
def test_a_batch_draws_what_each_whole_row_draws(monkeypatch, candidates):
    """A batch's sampled rows share their ops and top-k / top-p rows are drawn from the
    kept tokens alone (sampler._drawn); each seeded draw is the token the whole row's
    distribution gives (_probabilities + draw), for every cut, with min-p, and where
    top-p's candidates fall short."""
    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", candidates)
    settings = [
        SamplingParams(top_p=0.9, seed=1),
        SamplingParams(top_p=0.5, temperature=0.7, seed=2),
        SamplingParams(top_p=0.95, min_p=0.05, seed=3),
        SamplingParams(top_k=5, top_p=0.9, seed=4),
        SamplingParams(temperature=0, seed=5),
        SamplingParams(seed=6),
        SamplingParams(top_p=0.999999, temperature=2.0, seed=7),
        SamplingParams(temperature=0.5, min_p=0.1, seed=8),
        SamplingParams(top_k=40, seed=9),
        SamplingParams(top_k=1000, min_p=0.02, temperature=1.5, seed=10),  # k > the vocabulary
        SamplingParams(seed=11),
    ]
    generator = torch.Generator().manual_seed(9)
    for position in range(40):
        logits = torch.randn(len(settings), 600, generator=generator) * 2
        logits[:, ::9] = float("-inf")  # banned or masked tokens
        requests = [Request(params, output_ids=[0] * position) for params in settings]
        expected = [
            int(row.argmax())
            if request.params.temperature == 0
            else sampler_module.draw(
                sampler_module._probabilities(row.clone(), request.params),
                sampler_module.draw_generator(request),
            )
            for row, request in zip(logits, requests, strict=True)
        ]
        assert sampler(logits, requests) == expected
