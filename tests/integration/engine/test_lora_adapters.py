"""Loading, holding and unloading LoRA adapters in the engine: every bad folder refused
with AdapterInvalid and the engine serving on; slots, LRU, pinning, unloading under
running requests; the per-step adapter bound; the prefix cache salted by adapter."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from maas_services.engine.lora.errors import (
    AdapterInvalid,
    AdapterNotFound,
    AdapterSlotsFull,
    LoraDisabled,
)
from tests.integration.engine.test_llm_engine import greedy, make_engine, tokens
from tests.integration.engine.test_lora_outputs import generate

pytestmark = pytest.mark.slow

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])


@pytest.fixture
def copy_adapter(lora_adapter_dir, tmp_path):
    """copy_adapter(name) -> a copy of the trained adapter's folder, to spoil."""

    def copy(name: str):
        return shutil.copytree(lora_adapter_dir, tmp_path / name)

    return copy


def edit_config(folder, **fields) -> None:
    config = json.loads((folder / CONFIG).read_text())
    (folder / CONFIG).write_text(json.dumps(config | fields))


def edit_tensors(folder, change) -> None:
    tensors = load_file(folder / WEIGHTS)
    change(tensors)
    save_file(tensors, folder / WEIGHTS)


def spoil(case: str, folder) -> None:
    """Make the adapter at `folder` bad in the way `case` names."""
    match case:
        case "lacking target module":
            edit_config(folder, target_modules=["q_proj", "c_attn"])
        case "tensor of a module the model lacks":
            edit_tensors(
                folder, lambda t: t.update({Q_A.replace("q_proj", "c_attn"): t[Q_A].clone()})
            )
        case "tensor past the last layer":
            edit_tensors(folder, lambda t: t.update({Q_A.replace(".0.", ".99."): t[Q_A].clone()}))
        case "shape mismatch":
            edit_tensors(folder, lambda t: t.update({Q_A: t[Q_A][:, :-1].contiguous()}))
        case "rank above the config's":
            edit_config(folder, r=4)
        case "lora_B missing":
            edit_tensors(folder, lambda t: t.pop(Q_A.replace("lora_A", "lora_B")))
        case "non-finite weights":
            edit_tensors(folder, lambda t: t[Q_A].__setitem__((0, 0), float("nan")))
        case "missing config":
            (folder / CONFIG).unlink()
        case "missing weights":
            (folder / WEIGHTS).unlink()
        case "corrupt config":
            (folder / CONFIG).write_text('{"r": 8, "lora_al')
        case "corrupt weights":
            data = (folder / WEIGHTS).read_bytes()
            (folder / WEIGHTS).write_bytes(data[: len(data) // 2])
        case "garbage weights":
            (folder / WEIGHTS).write_bytes(b"\xff" * 4096)
        case "DoRA":
            edit_config(folder, use_dora=True)
        case "trained biases":
            edit_config(folder, bias="all")
        case "extra trained modules":
            edit_config(folder, modules_to_save=["lm_head"])
        case "not LoRA":
            edit_config(folder, peft_type="IA3")
        case "no folder":
            shutil.rmtree(folder)
        case _:
            raise AssertionError(case)


BAD = [
    "lacking target module",
    "tensor of a module the model lacks",
    "tensor past the last layer",
    "shape mismatch",
    "rank above the config's",
    "lora_B missing",
    "non-finite weights",
    "missing config",
    "missing weights",
    "corrupt config",
    "corrupt weights",
    "garbage weights",
    "DoRA",
    "trained biases",
    "extra trained modules",
    "not LoRA",
    "no folder",
]


def test_every_bad_adapter_is_refused_and_the_engine_serves_on(
    model, tokenizer, prompt, lora_adapter_dir, copy_adapter
):
    engine = make_engine(model, tokenizer)
    engine.load_adapter("good", str(lora_adapter_dir))
    expected = tokens(generate(engine, {"r": (prompt, greedy(8), "good")})["r"])
    for case in BAD:
        folder = copy_adapter(case.replace(" ", "-").replace("'", ""))
        spoil(case, folder)
        with pytest.raises(AdapterInvalid) as refused:
            engine.load_adapter("bad", str(folder))
        assert str(refused.value), case
        assert engine.adapters() == ["good"], case
        with pytest.raises(AdapterNotFound):
            engine.add_request("x", prompt, greedy(8), adapter="bad")
    # A rank above --max-lora-rank, on an engine with a lower one.
    low = make_engine(model, tokenizer, max_lora_rank=4)
    with pytest.raises(AdapterInvalid, match="max-lora-rank"):
        low.load_adapter("good", str(lora_adapter_dir))
    got = generate(engine, {"r": (prompt, greedy(8), "good"), "base": (prompt, greedy(8), "")})
    assert tokens(got["r"]) == expected
    assert tokens(got["base"]) != expected


def test_an_engine_with_max_loras_0_serves_no_adapters(model, tokenizer, prompt, lora_adapter_dir):
    engine = make_engine(model, tokenizer, max_loras=0)
    with pytest.raises(LoraDisabled):
        engine.load_adapter("a", str(lora_adapter_dir))
    with pytest.raises(LoraDisabled):
        engine.add_request("r", prompt, greedy(4), adapter="a")
    assert engine.adapters() == []


def test_loading_is_idempotent_for_the_same_source_and_refused_for_another(
    model, tokenizer, lora_adapter_dir, copy_adapter
):
    engine = make_engine(model, tokenizer)
    first = engine.load_adapter("a", str(lora_adapter_dir))
    assert (first.name, first.rank, first.source) == ("a", 8, str(lora_adapter_dir))
    assert engine.load_adapter("a", str(lora_adapter_dir)) == first
    with pytest.raises(AdapterInvalid, match="unload it"):
        engine.load_adapter("a", str(copy_adapter("other")))
    assert engine.adapters() == ["a"]


def test_idle_adapters_are_evicted_least_recently_used_and_pinned_or_busy_ones_never(
    model, tokenizer, prompt, lora_adapter_dir
):
    source = str(lora_adapter_dir)
    engine = make_engine(model, tokenizer, max_loras=2, max_cpu_loras=2)
    engine.load_adapter("a", source)
    engine.load_adapter("b", source)
    engine.add_request("use-a", prompt, greedy(4), adapter="a")  # a is now the most recent
    engine.step()
    engine.load_adapter("c", source)  # evicts b: idle, least recently used
    assert engine.adapters() == ["a", "c"]
    engine.unload_adapter("c")
    engine.load_adapter("p", source, pinned=True)
    # a runs a request, p is pinned: no room.
    with pytest.raises(AdapterSlotsFull):
        engine.load_adapter("d", source)
    assert engine.adapters() == ["a", "p"]
    while engine.has_work:
        engine.step()
    engine.load_adapter("d", source)  # a is idle now
    assert engine.adapters() == ["d", "p"]
    engine.load_adapter("e", source)  # d goes, p stays
    assert engine.adapters() == ["e", "p"]


def test_unloading_an_adapter_in_use_refuses_new_requests_and_lets_running_ones_finish(
    model, tokenizer, prompt, lora_adapter_dir
):
    engine = make_engine(model, tokenizer)
    engine.load_adapter("a", str(lora_adapter_dir))
    expected = tokens(generate(engine, {"alone": (prompt, greedy(12), "a")})["alone"])
    engine.add_request("running", prompt, greedy(12), adapter="a")
    outputs = engine.step()
    assert engine.unload_adapter("a") is True
    assert engine.adapters() == []
    assert engine.unload_adapter("a") is False  # already going
    with pytest.raises(AdapterNotFound):
        engine.add_request("late", prompt, greedy(4), adapter="a")
    while engine.has_work:
        outputs += engine.step()
    assert tokens(outputs) == expected and outputs[-1].finish_reason == "length"
    assert engine.lora.weights == {}  # gone with its last request
    engine.load_adapter("a", str(lora_adapter_dir))  # and loadable again
    assert engine.adapters() == ["a"]


def test_a_step_holds_at_most_max_loras_adapters_and_the_base_is_never_held_up(
    model, tokenizer, prompt, lora_adapter_dir
):
    """The worst case for the step bound: requests for more adapters than a step may
    hold, all at once, with base requests behind them. Each step holds at most
    max_loras adapters; the base requests run from the first step to the last as they
    would alone; every request gets the tokens it gets alone."""
    engine = make_engine(model, tokenizer, max_loras=2, max_num_batched_tokens=1024)
    names = [f"a{i}" for i in range(5)]
    for name in names:
        engine.load_adapter(name, str(lora_adapter_dir))
    requests = {f"r-{name}": (prompt, greedy(6), name) for name in names}
    requests |= {f"base{i}": (prompt, greedy(6), "") for i in range(2)}
    for request_id, (p, params, adapter) in requests.items():
        engine.add_request(request_id, p, params, adapter=adapter)
    outputs: dict[str, list] = {}
    steps = 0
    while engine.has_work:
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        steps += 1
        held = {seq.adapter for seq in engine.scheduler.running if seq.adapter}
        assert len(held) <= 2
        if steps == 6:  # one prefill step and five decodes
            assert all(outputs[f"base{i}"][-1].finish_reason == "length" for i in range(2))
    alone = tokens(generate(make_engine(model, tokenizer), {"x": (prompt, greedy(6), "")})["x"])
    adapted = tokens(outputs["r-a0"])
    assert adapted != alone
    for request_id, (_, _, adapter) in requests.items():
        assert tokens(outputs[request_id]) == (adapted if adapter else alone), request_id


def test_a_base_prefix_is_not_an_adapters_cache_hit(model, tokenizer, prompt, lora_adapter_dir):
    engine = make_engine(model, tokenizer)
    engine.load_adapter("a", str(lora_adapter_dir))
    engine.load_adapter("b", str(lora_adapter_dir))

    def cached(adapter: str) -> int:
        got = generate(engine, {"r": (prompt, greedy(2), adapter)})["r"]
        return got[-1].cached_prompt_tokens

    assert len(prompt) >= 16  # at least one full block
    assert cached("") == 0
    assert cached("") > 0  # the base's own prefix
    assert cached("a") == 0  # not the base's
    assert cached("a") > 0  # its own
    assert cached("b") == 0  # not another adapter's, the same weights or not
