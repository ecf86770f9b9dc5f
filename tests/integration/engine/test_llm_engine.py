"""The continuously batched engine on the real model, against transformers."""

import dataclasses

import pytest
import torch
from prometheus_client import REGISTRY

from maas_services.engine.checkpoint import save_model
from maas_services.engine.engine_config import build_configs
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.llm_engine import LLMEngine, RequestRejected
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_runner import ModelRunner
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.settings import EngineSettings
from maas_tools.distill.prompts import EDIT_TASKS
from maas_tools.eval.perplexity import DEFAULT_TEXT

pytestmark = pytest.mark.slow

NEW_TOKENS = 20
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain photosynthesis to a child.",
    "List three prime numbers.",
    "¿Cuál es el río más largo del mundo?",
    "Translate 'good morning' into German.",
    "Give me a tip for learning to code.",
    "What is 12 times 12?",
]
LONG_QUESTION = "Summarise this text in one sentence.\n\n" + " ".join(
    f"Sentence number {i} describes a small village by the river where people fish and sing."
    for i in range(20)
)


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    def render(question: str) -> list[int]:
        text = hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        return hf_tokenizer(text, add_special_tokens=False)["input_ids"]

    return [render(q) for q in [*QUESTIONS, LONG_QUESTION]]


def make_engine(model, tokenizer, num_blocks=512, **settings) -> LLMEngine:
    """An engine over a pool of num_blocks, set up as serving would be by these settings."""
    llama, config = model
    options = dict(max_num_seqs=16, max_num_batched_tokens=128) | settings
    engine, config = build_configs(EngineSettings(**options), config, num_blocks)
    cache = PagedKVCache.allocate(config, num_blocks, engine.block_size, torch.float32, "cpu")
    return LLMEngine(engine, config, ModelRunner(llama, config, cache, "cpu"), tokenizer)


def greedy(max_tokens=NEW_TOKENS, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict:
    """Add every request at once and step until all finish.

    Returns {(request id, sample index): [SeqOutput, ...]} and checks that the
    block accounting is whole again afterwards.
    """
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    outputs: dict[tuple[str, int], list] = {}
    steps = 0
    while engine.has_work:
        for out in engine.step():
            outputs.setdefault((out.request_id, out.index), []).append(out)
        steps += 1
        assert steps < 10_000
    engine.blocks.check_invariants([])
    assert engine.blocks.num_used_blocks == 0
    assert all(outs[-1].finish_reason for outs in outputs.values())
    return outputs


def tokens(outputs: list) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


def test_concurrent_greedy_equals_transformers(model, tokenizer, prompts, hf_greedy):
    assert max(len(p) for p in prompts) > 128, "one prompt must span several prefill chunks"
    engine = make_engine(model, tokenizer)
    got = run(engine, {f"r{i}": (p, greedy()) for i, p in enumerate(prompts)})
    for i, prompt in enumerate(prompts):
        assert tokens(got[(f"r{i}", 0)]) == hf_greedy(prompt, NEW_TOKENS), f"prompt {i} diverged"


def test_each_step_counts_what_it_did_and_the_metrics_record_exactly_that(
    model, tokenizer, prompts
):
    short, long = prompts[0], prompts[-1]
    assert len(short) < 128 < len(long), "the long prompt must share a step as a chunk"
    engine = make_engine(model, tokenizer)
    series = {
        "generated": ("maas_engine_generation_tokens_total", {}),
        "prompt": ("maas_engine_prompt_tokens_total", {}),
        "step_tokens": ("maas_engine_step_tokens_sum", {}),
        "batches": ("maas_engine_batch_size_count", {}),
        "ttft": ("maas_engine_time_to_first_token_seconds_count", {}),
        "itl": ("maas_engine_inter_token_latency_seconds_count", {}),
        "length": ("maas_engine_requests_finished_total", {"finish_reason": "length"}),
        "forward": ("maas_engine_step_phase_seconds_count", {"phase": "forward"}),
    }

    def sample(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {key: sample(*series[key]) for key in series}
    engine.add_request("short", short, greedy(3))
    engine.add_request("long", long, greedy(3))
    steps = []
    while engine.has_work:
        engine.step()
        steps.append(engine.last_stats)
    first = steps[0]
    # Both admitted at once: the short prompt whole, the long one's first chunk.
    assert (first.batch_size, first.num_prefill_tokens, first.num_decode_tokens) == (2, 128, 0)
    assert first.prompt_tokens == len(short) + len(long) and len(first.queue_seconds) == 2
    assert first.num_generated_tokens == len(first.ttft_seconds) == 1
    assert set(first.phase_seconds) == {"schedule", "forward", "postprocess"}
    assert steps[1].num_decode_tokens == 1  # the short one decodes beside the next chunk
    assert sum(s.num_prefill_tokens for s in steps) == len(short) + len(long)
    assert sum(s.num_decode_tokens for s in steps) == 2 * (3 - 1)
    assert [f.reason for s in steps for f in s.finished] == ["length", "length"]
    assert (steps[-1].num_running, steps[-1].num_waiting) == (0, 0)
    after = {key: sample(*series[key]) - before[key] for key in series}
    assert after == {
        "generated": 6,
        "prompt": len(short) + len(long),
        "step_tokens": len(short) + len(long) + 4,
        "batches": len(steps),
        "ttft": 2,
        "itl": 4,
        "length": 2,
        "forward": len(steps),
    }


def test_prefix_cache_hit_gives_the_same_tokens(model, tokenizer, prompts):
    engine = make_engine(model, tokenizer)
    prompt = prompts[-1]
    miss = run(engine, {"miss": (prompt, greedy())})[("miss", 0)]
    hit = run(engine, {"hit": (prompt, greedy())})[("hit", 0)]
    assert miss[-1].cached_prompt_tokens == 0
    # Every full block but the last is reused; the last is recomputed to sample from.
    assert hit[-1].cached_prompt_tokens == (len(prompt) // 16 - (len(prompt) % 16 == 0)) * 16
    assert tokens(hit) == tokens(miss)


def test_preemption_under_a_tiny_cache_keeps_every_answer(model, tokenizer, prompts, hf_greedy):
    short = prompts[:6]
    # Room for about two sequences at a time: the scheduler must preempt to finish.
    needed = max(len(p) for p in short) + NEW_TOKENS
    engine = make_engine(model, tokenizer, num_blocks=2 * (needed // 16 + 2))
    before = REGISTRY.get_sample_value("maas_engine_preemptions_total")
    got = run(engine, {f"r{i}": (p, greedy()) for i, p in enumerate(short)})
    assert REGISTRY.get_sample_value("maas_engine_preemptions_total") > before
    for i, prompt in enumerate(short):
        assert tokens(got[(f"r{i}", 0)]) == hf_greedy(prompt, NEW_TOKENS), f"prompt {i} diverged"


def test_seeded_sampling_is_reproducible_across_batches(model, tokenizer, prompts):
    params = dict(temperature=0.9, top_p=0.95, max_tokens=16, seed=42)
    alone = run(make_engine(model, tokenizer), {"a": (prompts[0], SamplingParams(**params))})
    crowd = run(
        make_engine(model, tokenizer),
        {
            "a": (prompts[0], SamplingParams(**params)),
            **{
                f"b{i}": (p, SamplingParams(temperature=1.0, max_tokens=16))
                for i, p in enumerate(prompts[1:5])
            },
        },
    )
    other_seed = run(
        make_engine(model, tokenizer), {"a": (prompts[0], SamplingParams(**{**params, "seed": 7}))}
    )
    assert tokens(alone[("a", 0)]) == tokens(crowd[("a", 0)])
    assert tokens(alone[("a", 0)]) != tokens(other_seed[("a", 0)])


def test_parallel_samples_share_the_prompt_and_diverge(model, tokenizer, prompts, hf_greedy):
    engine = make_engine(model, tokenizer)
    got = run(
        engine,
        {
            "g": (prompts[1], greedy(n=3)),
            "s": (
                prompts[2],
                SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=3, n=3),
            ),
        },
    )
    reference = hf_greedy(prompts[1], NEW_TOKENS)
    assert [tokens(got[("g", i)]) for i in range(3)] == [reference] * 3
    sampled = [tuple(tokens(got[("s", i)])) for i in range(3)]
    assert len(set(sampled)) > 1


def test_abort_frees_blocks_at_once(model, tokenizer, prompts):
    engine = make_engine(model, tokenizer)
    engine.add_request("x", prompts[-1], greedy(200))
    for _ in range(3):
        engine.step()
    assert engine.blocks.num_used_blocks > 0
    (out,) = engine.abort("x")
    assert out.finish_reason == "abort"
    assert engine.blocks.num_used_blocks == 0
    assert not engine.has_work
    engine.blocks.check_invariants([])


def test_requests_that_can_never_fit_are_refused(model, tokenizer, prompts):
    engine = make_engine(model, tokenizer, num_blocks=8)
    with pytest.raises(RequestRejected, match="KV slots"):
        engine.add_request("big", prompts[-1], greedy(100))
    with pytest.raises(RequestRejected, match="maximum context length"):
        make_engine(model, tokenizer).add_request("long", [1] * 9000, greedy(1))
    with pytest.raises(RequestRejected, match="temperature"):
        engine.add_request("bad", prompts[0], SamplingParams(temperature=-1))
    assert not engine.has_work


def test_stop_strings_and_max_tokens_finish_reasons(model, tokenizer, prompts):
    engine = make_engine(model, tokenizer)
    free = run(engine, {"free": (prompts[3], greedy(24))})[("free", 0)]
    text = "".join(o.text for o in free)
    stop = text.split()[2]
    got = run(engine, {"stop": (prompts[3], greedy(24, stop=[stop]))})[("stop", 0)]
    stopped_text = "".join(o.text for o in got)
    assert got[-1].finish_reason == "stop"
    assert stop not in stopped_text and text.startswith(stopped_text)
    assert free[-1].finish_reason == "length"


def test_speculative_greedy_is_token_identical_and_accepts_drafts(
    model, tokenizer, hf_tokenizer, hf_greedy, prompts
):
    text = "The quick brown fox jumps over the lazy dog near the quiet river bank."
    rendered = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Repeat this sentence three times: {text}"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    repeat = hf_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    engine = make_engine(
        model,
        tokenizer,
        speculative_method="ngram",
        num_speculative_tokens=4,
        speculative_max_batch=8,
    )
    accepted = REGISTRY.get_sample_value("maas_engine_spec_accepted_tokens_total") or 0.0
    got = run(
        engine,
        {
            "spec": (repeat, greedy(40, speculative=True)),
            "plain": (prompts[0], greedy()),  # shares the batch, does not opt in
        },
    )
    assert tokens(got[("spec", 0)]) == hf_greedy(repeat, 40)
    assert tokens(got[("plain", 0)]) == hf_greedy(prompts[0], NEW_TOKENS)
    assert REGISTRY.get_sample_value("maas_engine_spec_accepted_tokens_total") > accepted

    # An edit of a text: a sequence that ends inside an accepted draft, where
    # the engine once indexed the blocks it had just freed.
    passage = " ".join(DEFAULT_TEXT.read_text(encoding="utf-8").split()[240:360])
    rendered = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{EDIT_TASKS[1]}\n\n{passage}"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    edit = hf_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    got = run(
        engine,
        {
            mode: (edit, SamplingParams(temperature=0, max_tokens=96, speculative=mode == "spec"))
            for mode in ("spec", "plain")
        },
    )
    assert tokens(got[("spec", 0)]) == tokens(got[("plain", 0)])


def test_draft_model_speculation_is_token_identical(model, tokenizer, hf_greedy, prompts, tmp_path):
    llama, config = model
    # A real draft that is often wrong: the target's embeddings and first two layers.
    draft = LlamaForCausalLM(dataclasses.replace(config, num_layers=2))
    wanted = draft.state_dict().keys()
    draft.load_state_dict({k: v for k, v in llama.state_dict().items() if k in wanted})
    engine = make_engine(
        model,
        tokenizer,
        speculative_method="draft",
        speculative_draft_model=str(save_model(draft, tmp_path / "draft")),
        speculative_max_batch=4,
        speculative_draft_context=256,
    )
    drafted = REGISTRY.get_sample_value("maas_engine_spec_draft_tokens_total") or 0.0
    got = run(
        engine,
        {
            "short": (prompts[0], greedy(speculative=True)),
            "long": (prompts[-1], greedy(speculative=True)),
        },
    )
    assert tokens(got[("short", 0)]) == hf_greedy(prompts[0], NEW_TOKENS)
    assert tokens(got[("long", 0)]) == hf_greedy(prompts[-1], NEW_TOKENS)
    assert REGISTRY.get_sample_value("maas_engine_spec_draft_tokens_total") > drafted
