import json

import gguf
import pytest
from tokenizers import Tokenizer, pre_tokenizers

from maas_services.common.tokenizer_loader import TokenizerLoadError, load_tokenizer

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you've seen it; they'll say we'd won.",
    "UPPER lower MiXeD CamelCaseIdentifier snake_case_name",
    "def add(a, b):\n    return a + b\n",
    "class Foo:\n\tdef bar(self):\n\t\tpass\n",
    "if (x) {\n        y++;\n    }\n",
    "12345",
    "3.14",
    "pi is 3.14159 and e is 2.71828",
    "1,000,000 dollars in 2024-01-31",
    "-42 +7 0x1F 1e-9",
    "Emoji: 😀 🤖 👍🏽",
    "Family 👨\u200d👩\u200d👧 and flag 🇫🇷",
    "你好，世界！今天天气很好。",
    "日本語のテキストです",
    "مرحبا بالعالم",
    "Ça va très bien, garçon ! Où est l'hôtel ?",
    "Größe, Straße, naïve, coöperate",
    "Привет, как дела?",
    "a  b   c    d",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\nnewlines\n\n",
    "tabs\tand\ttabs",
    "\r\nwindows line\r\n",
    "<|im_start|>user\nHi there<|im_end|>",
    "text with <|endoftext|> inside",
    "not special: <|im_star|> <im_start>",
    "<repo_name>maas<file_sep>main.py",
    "https://example.com/path?q=1&r=two#frag",
    'JSON {"key": [1, 2, 3], "nested": {"a": null}}',
    "symbols !@#$%^&*()_+-=[]{}|;:',.<>/?`~",
    "",
    " ",
]

# A run of whitespace right before a digit. SmolLM2's tokenizer.json (and llama.cpp's
# "smollm" pre-tokenizer) isolate digits first; transformers' GGUF loader does not,
# so here the reference is transformers' vocabulary with the pre-tokenizer SmolLM2 ships.
DIGIT_EDGE_TEXTS = ["  1", "a  123", "x\n\n1", "  42  ", "hello   9 world", "x  \n 5", "\t\t7"]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tokenizer, hf_tokenizer, text):
    assert tokenizer.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def smollm2_reference(hf_tokenizer):
    reference = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return reference


@pytest.mark.parametrize("text", TEXTS + DIGIT_EDGE_TEXTS)
def test_encode_matches_smollm2_pretokenizer(tokenizer, smollm2_reference, text):
    assert tokenizer.encode(text) == smollm2_reference.encode(text, add_special_tokens=False).ids


def test_whitespace_before_digit_stays_one_token(tokenizer):
    assert [tokenizer.id_to_token(i) for i in tokenizer.encode("  1")] == ["ĠĠ", "1"]


@pytest.mark.parametrize("text", TEXTS + DIGIT_EDGE_TEXTS)
def test_decode_round_trips(tokenizer, hf_tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_special_tokens_are_atomic_and_skippable(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == tokenizer.bos_token_id
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids) == "user\nHi"


def test_model_facts_match_transformers(tokenizer, hf_tokenizer):
    assert tokenizer.bos_token_id == hf_tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_id == hf_tokenizer.eos_token_id == 2
    assert tokenizer.bos_token == hf_tokenizer.bos_token == "<|im_start|>"
    assert tokenizer.eos_token == hf_tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.vocab_size == len(hf_tokenizer) == 49152
    assert tokenizer.chat_template == hf_tokenizer.chat_template
    assert tokenizer.max_model_len == 8192
    assert tokenizer.id_to_token(tokenizer.eos_token_id) == "<|im_end|>"


def test_smollm2_adds_no_bos(tokenizer):
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi")


def test_loads_hugging_face_folder(tmp_path, tokenizer):
    tokenizer.tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = {
        "bos_token": {"content": "<|im_start|>", "special": True},
        "eos_token": "<|im_end|>",
        "chat_template": [{"name": "default", "template": "{{ 'x' }}"}],
        "model_max_length": 2048,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))

    loaded = load_tokenizer(tmp_path)

    assert loaded.encode(TEXTS[4]) == tokenizer.encode(TEXTS[4])
    assert (loaded.bos_token_id, loaded.eos_token_id) == (1, 2)
    assert loaded.chat_template == "{{ 'x' }}"
    assert loaded.max_model_len == 2048

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert load_tokenizer(tmp_path).max_model_len == 8192


def test_loads_folder_saved_by_transformers(tmp_path, tokenizer, hf_tokenizer):
    hf_tokenizer.save_pretrained(tmp_path)

    loaded = load_tokenizer(tmp_path)

    assert loaded.chat_template == tokenizer.chat_template
    assert loaded.eos_token_id == tokenizer.eos_token_id
    assert loaded.encode("Hello, world!") == tokenizer.encode("Hello, world!")


def test_unset_model_max_length_is_unknown(tmp_path, tokenizer):
    tokenizer.tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": int(1e30)}))
    assert load_tokenizer(tmp_path).max_model_len is None


def _write_gguf(path, model="gpt2", pre="gpt-2", add_bos=False):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(["<s>", "</s>", "a", "b", "ab"])
    writer.add_token_types([gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * 3)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_gguf_add_bos_flag_applies_on_request(tmp_path):
    tiny = load_tokenizer(_write_gguf(tmp_path / "tiny.gguf", add_bos=True))
    assert tiny.encode("ab") == [4]
    assert tiny.encode("ab", add_special_tokens=True) == [0, 4]
    assert tiny.max_model_len == 64
    assert tiny.chat_template is None


@pytest.mark.parametrize(("model", "pre"), [("llama", "gpt-2"), ("gpt2", "qwen2")])
def test_unsupported_gguf_tokenizers_are_refused(tmp_path, model, pre):
    with pytest.raises(TokenizerLoadError, match="not supported"):
        load_tokenizer(_write_gguf(tmp_path / "tiny.gguf", model=model, pre=pre))


def test_unreadable_paths_are_refused(tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(TokenizerLoadError):
        load_tokenizer(tmp_path / "junk.gguf")
    with pytest.raises(TokenizerLoadError):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
