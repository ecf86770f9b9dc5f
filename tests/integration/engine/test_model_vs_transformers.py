"""Our engine against transformers reading the same GGUF file: same weights, same tokens."""

import json
import random
from contextlib import nullcontext

import pytest
import torch

from maas_services.engine import native_attention
from maas_services.engine.attention_metadata import AttentionMetadata
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.loader import load_model
from maas_services.engine.model import LlamaForCausalLM
from maas_services.engine.model_config import ModelConfig
from maas_services.engine.model_runner import ModelRunner, choose_path
from maas_services.engine.sampler import Sampler, make_generator
from maas_services.engine.sampling_params import SamplingParams
from maas_services.engine.scheduler import ScheduledSeq
from maas_services.engine.sequence import Sequence

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

MIN_NEW, MAX_NEW = 32, 40
BLOCK_SIZE = 16
CHUNK = 64  # most prompt tokens a sequence computes per step; the long prompt takes several

LONG_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, "
    "a goldsmith from Mainz, combined movable metal type, oil-based ink and a wooden screw press "
    "adapted from the ones used to make wine. Before his invention, books in Europe were copied "
    "by hand, usually by monks working in monastery scriptoria, and a single Bible could take a "
    "scribe more than a year to finish. Block printing had existed in China for centuries, and "
    "Bi Sheng had even experimented with movable clay type around 1040, but the thousands of "
    "characters in written Chinese made the method impractical there. The Latin alphabet, with "
    "only a few dozen letters, was far better suited to it. Gutenberg's Bible, completed around "
    "1455, was printed in about 180 copies, and within fifty years printing shops had spread to "
    "more than two hundred cities across the continent. Millions of books were produced by 1500. "
    "The consequences were enormous: prices fell, literacy rose, scientific results could be "
    "shared precisely and quickly, and the Protestant Reformation spread Martin Luther's pamphlets "
    "faster than the authorities could suppress them. Standardised spelling and grammar followed, "
    "because printers needed consistent forms, and national languages gained prestige at the "
    "expense of Latin. Historians still debate whether the press caused these changes or merely "
    "accelerated trends that were already under way, but few doubt that it reshaped the way "
    "knowledge was stored and transmitted for the next five centuries."
)

CONVERSATIONS = {
    "fact": [{"role": "user", "content": "What is the capital of France?"}],
    "poem": [{"role": "user", "content": "Write a short poem about the sea at night."}],
    "code": [
        {
            "role": "user",
            "content": "Write a Python function that checks whether a number is prime.",
        }
    ],
    "spanish": [
        {"role": "user", "content": "¿Qué beneficios tiene hacer ejercicio todos los días?"}
    ],
    "chinese": [{"role": "user", "content": "请简单介绍一下长城的历史。"}],
    "multi_turn": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colors."},
        {"role": "assistant", "content": "Red, yellow and blue."},
        {"role": "user", "content": "Which two of them make green?"},
    ],
    "long": [
        {
            "role": "user",
            "content": f"Summarise the following text in two sentences.\n\n{LONG_TEXT}",
        }
    ],
}


@pytest.fixture(scope="module")
def ours(smollm_path) -> tuple[LlamaForCausalLM, ModelConfig]:
    return load_model(smollm_path, torch.float32, progress=False)


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> dict[str, list[int]]:
    return {
        name: hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        for name, messages in CONVERSATIONS.items()
    }


def greedy_batch(
    model: LlamaForCausalLM,
    config: ModelConfig,
    prompts: list[list[int]],
    max_tokens: int,
    min_tokens: int = 0,
    native: bool = True,
    compiled: bool = False,
) -> list[list[int]]:
    """Greedy outputs of all prompts generated together, this function playing scheduler.

    Every step runs each unfinished sequence: up to CHUNK prompt tokens, or its
    one new token, so prompt chunks and decodes share steps.
    """
    params = SamplingParams(temperature=0, max_tokens=max_tokens, min_tokens=min_tokens)
    needed = [-(-(len(p) + max_tokens) // BLOCK_SIZE) for p in prompts]
    free = list(range(sum(needed)))
    random.Random(0).shuffle(free)
    seqs = [
        Sequence(
            request_id=str(i),
            index=0,
            token_ids=list(prompt),
            num_prompt_tokens=len(prompt),
            params=params,
            generator=make_generator(0),
            block_table=[free.pop() for _ in range(n)],
        )
        for i, (prompt, n) in enumerate(zip(prompts, needed, strict=True))
    ]
    dtype = next(model.parameters()).dtype
    pool = PagedKVCache.allocate(config, sum(needed), BLOCK_SIZE, dtype, "cpu")
    runner = ModelRunner(
        model, config, pool, "cpu", path=choose_path(model, compiled=compiled, native=native)
    )
    sampler = Sampler(config.eos_token_ids)
    running = list(seqs)
    while running:
        work = [ScheduledSeq(s, min(s.num_uncomputed_tokens, CHUNK)) for s in running]
        sampling = [w.seq for w in work if w.samples]
        logits = runner.execute(work, []).logits
        for w in work:
            w.seq.num_computed_tokens += w.num_new_tokens
        for seq, row in zip(sampling, logits, strict=True):
            seq.token_ids.append(sampler(row, [seq])[0])
        running = [s for s in running if not finished(s, config)]
    return [s.output_ids for s in seqs]


def finished(seq: Sequence, config: ModelConfig) -> bool:
    outputs = seq.output_ids
    return len(outputs) >= seq.params.max_tokens or (
        bool(outputs) and outputs[-1] in config.eos_token_ids
    )


def prefill_logits(model: LlamaForCausalLM, prompt: list[int]) -> torch.Tensor:
    """Logits at every position of the prompt, computed in one forward."""
    blocks = -(-len(prompt) // BLOCK_SIZE)
    dtype = next(model.parameters()).dtype
    pool = PagedKVCache.allocate(model.config, blocks, BLOCK_SIZE, dtype, "cpu")
    positions = torch.arange(len(prompt))
    meta = AttentionMetadata.build(
        positions, [len(prompt)], [len(prompt)], [list(range(blocks))], BLOCK_SIZE, "cpu"
    )
    with torch.inference_mode():
        hidden = model(torch.tensor(prompt), positions, pool, meta)
        return model.compute_logits(hidden).float()


@pytest.fixture(scope="module", params=["eager", "compiled", "torch"])
def batched(request, ours, prompts, smollm_path) -> dict[str, list[int]]:
    """Every conversation's greedy output, all generated in one concurrent batch,
    by the eager model (native attention and layer halves), by a copy of it
    compiled (--no-enforce-eager), and by the eager model on torch alone (where
    the native library is missing; --no-native-layers)."""
    model, config = ours
    if request.param == "compiled":
        model, config = load_model(smollm_path, torch.float32, progress=False)
    native = request.param != "torch"
    path = nullcontext() if native else native_attention.torch_path()
    with path:
        compiled = request.param == "compiled"
        outputs = greedy_batch(
            model, config, list(prompts.values()), MAX_NEW, MIN_NEW, native, compiled
        )
    return dict(zip(prompts, outputs, strict=True))


@pytest.fixture(scope="module")
def references(prompts, hf_model, hf_tokenizer) -> dict[str, list[int]]:
    """transformers' greedy output of every conversation, generated once for both paths."""
    memo: dict[str, list[int]] = {}
    for name, prompt in prompts.items():
        with torch.inference_mode():
            memo[name] = hf_model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                min_new_tokens=MIN_NEW,
                pad_token_id=hf_tokenizer.eos_token_id,
            )[0, len(prompt) :].tolist()
    return memo


def test_the_long_prompt_is_long(prompts):
    assert len(prompts["long"]) >= 300 > 4 * CHUNK


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_greedy_tokens_match_transformers(name, batched, references):
    assert len(references[name]) >= MIN_NEW
    assert batched[name] == references[name]


def test_prefill_logits_match_transformers(prompts, ours, hf_model):
    prompt = prompts["long"]
    with torch.inference_mode():
        reference = hf_model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(prefill_logits(ours[0], prompt), reference, atol=1e-3, rtol=1e-4)


def test_safetensors_folder_loads_the_same_model(tmp_path, hf_model, prompts, ours):
    from safetensors.torch import save_file

    # transformers' own weights (it undid the rotary permutation itself), tied head left out.
    weights = {k: v.contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    save_file(weights, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(hf_model.config.to_dict()))
    model, config = load_model(tmp_path, torch.float32, progress=False)
    assert config == ours[1]
    prompt = prompts["fact"]
    torch.testing.assert_close(prefill_logits(model, prompt), prefill_logits(ours[0], prompt))


def test_bfloat16_generates_the_same_start(smollm_path, prompts, ours, hf_tokenizer):
    model, config = load_model(smollm_path, torch.bfloat16, progress=False)
    assert next(model.parameters()).dtype == torch.bfloat16
    prompt = prompts["fact"]
    tokens = greedy_batch(model, config, [prompt], 12)[0]
    assert "Paris" in hf_tokenizer.decode(tokens)
    assert tokens[:4] == greedy_batch(*ours, [prompt], 4)[0]
    logits = prefill_logits(model, prompts["code"])[-1]
    reference = prefill_logits(ours[0], prompts["code"])[-1]
    assert logits.argmax() == reference.argmax()
    torch.testing.assert_close(logits, reference, atol=1.0, rtol=0.05)
