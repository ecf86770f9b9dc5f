"""The draft-model proposer and the checkpoint format it loads, on a tiny random Llama."""

import json

import pytest
import torch

from maas_services.engine.checkpoint import save_model
from maas_services.engine.dense_forward import dense_logits
from maas_services.engine.kv_cache import PagedKVCache
from maas_services.engine.loader import load_model
from maas_services.engine.model_runner import ModelRunner
from maas_services.engine.spec.config import SpecConfig
from maas_services.engine.spec.draft_model import BLOCK_SIZE, DraftModelProposer
from maas_services.engine.spec.proposer import DraftRequest, TargetInfo, make_proposer


def greedy(model, token_ids: list[int], count: int) -> list[int]:
    out = list(token_ids)
    for _ in range(count):
        out.append(int(dense_logits(model, out)[-1].argmax()))
    return out[len(token_ids) :]


def proposer_for(model, config, slots: int, slot_tokens: int) -> DraftModelProposer:
    cache = PagedKVCache.allocate(
        config, slots * slot_tokens // BLOCK_SIZE, BLOCK_SIZE, torch.float32, "cpu"
    )
    return DraftModelProposer(ModelRunner(model, config, cache, "cpu"), slots, slot_tokens)


def test_drafts_are_the_draft_models_greedy_continuation_after_rejections(tiny_model, tiny_config):
    proposer = proposer_for(tiny_model, tiny_config, slots=2, slot_tokens=64)
    tokens = [3, 14, 15, 9, 2, 6, 5, 35, 8, 9]
    draft = proposer.propose([DraftRequest("a", tokens, 4)])[0]
    assert draft == greedy(tiny_model, tokens, 4)
    # The target kept two guesses and then chose another token: the draft's
    # cached KV of its rejected guesses must not leak into the next proposal.
    other = next(t for t in range(tiny_config.vocab_size) if t != draft[2])
    tokens = tokens + draft[:2] + [other]
    assert proposer.propose([DraftRequest("a", tokens, 3)])[0] == greedy(tiny_model, tokens, 3)


def test_batches_evicts_least_recent_and_windows_long_sequences(tiny_model, tiny_config):
    proposer = proposer_for(tiny_model, tiny_config, slots=2, slot_tokens=32)
    seqs = {key: [(7 * key + i) % 60 + 2 for i in range(5 + key)] for key in range(3)}
    # Three sequences, two slots: later calls evict the least recently used, and
    # the evicted sequence is recomputed right; one call serves as many as it has slots.
    for keys in ((0, 1), (2, 0), (1, 2), (0, 1, 2)):
        drafts = proposer.propose([DraftRequest(k, seqs[k], 3) for k in keys])
        expected = [greedy(tiny_model, seqs[k], 3) for k in keys[:2]]
        assert drafts == expected + [[]] * (len(keys) - 2)
    # Past the slot, the draft sees the most recent half slot of tokens.
    long = [(5 * i) % 60 + 2 for i in range(40)]
    assert proposer.propose([DraftRequest("long", long, 4)])[0] == greedy(tiny_model, long[-16:], 4)
    assert proposer.propose([DraftRequest("none", long, 0)]) == [[]]


def test_checkpoint_round_trips_and_the_registry_loads_it(tiny_model, tiny_config, tmp_path):
    folder = save_model(tiny_model, tmp_path / "draft", {"draft_of": "tiny"})
    assert json.loads((folder / "config.json").read_text())["draft_of"] == "tiny"
    loaded, config = load_model(folder, torch.float32, progress=False)
    assert config == tiny_config
    tokens = [1, 2, 3, 4, 5]
    torch.testing.assert_close(dense_logits(loaded, tokens), dense_logits(tiny_model, tokens))

    target = TargetInfo(tiny_config.vocab_size, 64, "cpu", torch.float32)
    spec = SpecConfig(method="draft", draft_model=str(folder), max_batch=2, draft_context=32)
    proposer = make_proposer(spec, target)
    assert proposer.propose([DraftRequest(0, tokens, 2)]) == [greedy(tiny_model, tokens, 2)]
    wrong_vocab = TargetInfo(tiny_config.vocab_size + 1, 64, "cpu", torch.float32)
    with pytest.raises(ValueError, match="vocabulary"):
        make_proposer(spec, wrong_vocab)
