"""A GGUF read once: the Hugging Face folder derived from it loads back as the same model.

Each test points the cache at its own folder, so the first load is the GGUF
path (which writes the folder) and the second the cached one.
"""

import json
import os
import time

import pytest
import torch

from maas_services.common import tokenizer_loader
from maas_services.common.model_cache import UNUSED_SECONDS, derived_folder, publish
from maas_services.common.tokenizer_loader import load_tokenizer
from maas_services.engine import loader
from tests.hf_reference import hf_reference_model

TEXTS = [
    "Hello, world!",
    "  1 22  333\n\tindent",
    "<|im_start|>user\nhi<|im_end|>",
    "naïve café 日本語 🙂",
]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MAAS_CACHE_DIR", str(tmp_path))
    return tmp_path


def _unread(*_):
    raise AssertionError("the GGUF was read again although its folder is cached")


def test_cached_tokenizer_encodes_and_describes_the_model_as_the_gguf_does(
    cache_dir, smollm_path, monkeypatch
):
    direct = load_tokenizer(smollm_path)  # cold: read from the GGUF, and the folder written
    monkeypatch.setattr(tokenizer_loader, "_load_gguf", _unread)
    warm = load_tokenizer(smollm_path)

    assert [warm.encode(t) for t in TEXTS] == [direct.encode(t) for t in TEXTS]
    assert warm.encode("hi", add_special_tokens=True) == direct.encode(
        "hi", add_special_tokens=True
    )
    facts = ("bos_token_id", "eos_token_id", "bos_token", "eos_token", "chat_template")
    assert [getattr(warm, f) for f in facts] == [getattr(direct, f) for f in facts]
    assert warm.max_model_len == direct.max_model_len
    assert warm.special_tokens.ids == direct.special_tokens.ids
    ids = direct.encode(TEXTS[3])
    assert warm.tokenizer.decode(ids) == direct.tokenizer.decode(ids)


def test_cached_weights_are_the_dequantized_gguf_tensors(cache_dir, smollm_path, monkeypatch):
    direct_config, direct = loader.load_gguf(smollm_path)
    # Small shards, so the folder is several files as a large model's would be.
    monkeypatch.setattr(loader, "_SHARD_BYTES", 64 << 20)
    cold_config, cold = loader._load_gguf_cached(smollm_path)
    shards = {path.name for path in derived_folder(smollm_path).glob("model-*.safetensors")}
    assert len(shards) > 1
    # Hugging Face's index names every tensor's shard: transformers loads the folder by it.
    index = json.loads((derived_folder(smollm_path) / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(direct)
    assert set(index["weight_map"].values()) == shards
    monkeypatch.setattr(loader, "load_gguf", _unread)
    warm_config, warm = loader._load_gguf_cached(smollm_path)

    assert warm_config == cold_config == direct_config
    assert sorted(warm) == sorted(cold) == sorted(direct)
    for name in direct:
        assert torch.equal(warm[name], direct[name]), name


def test_a_changed_source_file_gets_a_new_folder(cache_dir, tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"one")
    first = derived_folder(source)
    source.write_bytes(b"two!")
    assert derived_folder(source) != first


def test_an_unwritable_cache_is_skipped_and_leaves_nothing_behind(tmp_path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    assert not publish(blocked / "models" / "m", "tokenizer.json", lambda p: p.write_text("{}"))

    folder = tmp_path / "ok"
    assert not publish(folder, "config.json", _fail_midway)
    assert list(folder.iterdir()) == []


def _fail_midway(path):
    path.write_text("half")
    raise OSError(28, "No space left on device")


def _folder(path, unused_for: float):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    past = time.time() - unused_for
    os.utime(path, (past, past))
    return path


def test_a_new_folder_removes_the_folders_unused_for_a_day(cache_dir, tmp_path):
    models = cache_dir / "models"
    gone = _folder(models / "deleted-source-0", unused_for=UNUSED_SECONDS + 60)
    recent = _folder(models / "recent-0", unused_for=UNUSED_SECONDS - 60)
    # Idle as long, but looked up again (a start reading it): marked used, kept.
    source = tmp_path / "live.gguf"
    source.write_bytes(b"live")
    live = _folder(derived_folder(source), unused_for=UNUSED_SECONDS + 60)
    assert derived_folder(source) == live
    # Writing into a folder that exists prunes nothing.
    assert publish(recent, "tokenizer.json", lambda p: p.write_text("{}"))
    assert gone.is_dir()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"other")
    assert publish(derived_folder(other), "config.json", lambda p: p.write_text("{}"))
    assert sorted(models.iterdir()) == sorted([recent, live, derived_folder(other)])


def test_a_folder_outside_the_cache_prunes_nothing(tmp_path):
    beside = _folder(tmp_path / "someone-elses", unused_for=10 * UNUSED_SECONDS)
    assert publish(tmp_path / "ok", "config.json", lambda p: p.write_text("{}"))
    assert beside.is_dir()


def test_transformers_reads_the_derived_folder_as_the_gguf_itself(smollm_path):
    """What lets the tests' transformers reference (tests/hf_reference.py) load the
    derived folder instead of the GGUF: transformers' own reading of the file, its
    dequantization and its tensor-name map included, is the same model."""
    transformers = pytest.importorskip("transformers")
    from_gguf = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm_path.parent), gguf_file=smollm_path.name, dtype=torch.float32
    ).eval()
    from_folder = hf_reference_model(smollm_path)

    assert type(from_folder) is type(from_gguf)
    gguf_config, folder_config = from_gguf.config.to_dict(), from_folder.config.to_dict()
    naming = {"_name_or_path", "_model_name_or_path", "architectures", "quantization_config"}
    # The GGUF's tokenizer ids ride on its config; the folder's are in its tokenizer files.
    tokens = {"pad_token_id", "unk_token_id"}
    for key in gguf_config.keys() - naming - tokens:
        assert folder_config.get(key) == gguf_config[key], key
    expected, got = from_gguf.state_dict(), from_folder.state_dict()
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = torch.tensor([load_tokenizer(smollm_path).encode_chat(chat)])
    with torch.inference_mode():
        assert torch.equal(from_folder(prompt).logits, from_gguf(prompt).logits)
