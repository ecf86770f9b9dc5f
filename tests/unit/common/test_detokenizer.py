import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maas_services.common.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! This is a plain English sentence.",
    "Emoji 😀🤖👍🏽 in a row, then 👨\u200d👩\u200d👧 and 🇫🇷🇯🇵.",
    "你好，世界！今天天气很好。日本語のテキスト。한국어 텍스트.",
    "مرحبا بالعالم — Ça va très bien, garçon !",
    "def f(x):\n    return x ** 2  # square\n\n\tindented\n",
    "Math: ∑ᵢ xᵢ² ≤ ∞, π ≈ 3.14159, 𝔸𝔹ℂ",
    "🤖",
    "",
]


def _stream(detokenizer, ids):
    return [detokenizer.push(token_id) for token_id in ids] + [detokenizer.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


@pytest.mark.parametrize("text", TEXTS)
def test_prompt_context_changes_nothing_for_byte_level(tokenizer, text):
    prompt_ids = tokenizer.encode("<|im_start|>user\nSay something 😀<|im_end|>\n")
    ids = tokenizer.encode(text)
    deltas = _stream(IncrementalDetokenizer(tokenizer, prompt_ids=prompt_ids), ids)
    assert "".join(deltas) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_partial_character_is_held_until_complete(tokenizer):
    ids = tokenizer.encode("🤖")
    assert len(ids) > 1
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert [detokenizer.push(token_id) for token_id in ids] == [""] * (len(ids) - 1) + ["🤖"]
    assert detokenizer.flush() == ""


def test_flush_gives_up_on_an_unfinished_character(tokenizer):
    first_half = tokenizer.encode("🤖")[:-1]
    deltas = _stream(IncrementalDetokenizer(tokenizer), tokenizer.encode("ok ") + first_half)
    assert deltas[-1] == "\ufffd"
    assert "".join(deltas) == tokenizer.decode(tokenizer.encode("ok ") + first_half)


def test_invalid_bytes_pass_through_as_the_full_decode_shows_them(tokenizer):
    stray_continuation = tokenizer.encode("😀")[-1]
    ids = [stray_continuation, *tokenizer.encode("abc")]
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids)
    assert "".join(deltas) == tokenizer.decode(ids) == "\ufffdabc"


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_special_tokens_follow_skip_flag(tokenizer, skip_special_tokens):
    ids = tokenizer.encode("Sure 😀<|im_end|>")
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    text = "".join(_stream(detokenizer, ids))
    assert text == ("Sure 😀" if skip_special_tokens else "Sure 😀<|im_end|>")


class _RecordingTokenizer:
    """Remembers how many ids each decode call saw."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.window_sizes = []

    def decode(self, ids, skip_special_tokens=True):
        self.window_sizes.append(len(ids))
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_each_token_decodes_a_small_window(tokenizer):
    ids = tokenizer.encode(" ".join(TEXTS) * 20)
    recording = _RecordingTokenizer(tokenizer)
    detokenizer = IncrementalDetokenizer(recording, prompt_ids=ids[:100])
    assert "".join(_stream(detokenizer, ids)) == tokenizer.decode(ids)
    assert len(ids) > 1000
    assert max(recording.window_sizes) <= 10


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=40))
def test_any_text_streams_back_exactly(tokenizer, text):
    # Not always `text`: SmolLM2's vocabulary lacks a few bytes (0xF1, 0xF2, some
    # control characters) and BPE without an unknown token drops them, as transformers does.
    ids = tokenizer.encode(text)
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids)
    full = tokenizer.decode(ids)
    assert "".join(deltas) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in delta for delta in deltas)


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.integers(min_value=0, max_value=49151), max_size=30))
def test_any_token_sequence_streams_back_exactly(tokenizer, ids):
    deltas = _stream(IncrementalDetokenizer(tokenizer), ids)
    full = tokenizer.decode(ids)
    assert "".join(deltas) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in delta for delta in deltas)
