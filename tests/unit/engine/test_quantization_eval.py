"""`maas eval perplexity` and the perplexity it computes, on the tiny random model."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from maas_services.engine.dense_forward import dense_logits
from maas_tools.eval import cli
from maas_tools.eval.perplexity import DEFAULT_TEXT, perplexity

TOKENS = [3, 17, 42, 8, 8, 60, 5, 21, 33, 9, 11, 2, 50, 7]


def test_a_model_that_knows_nothing_has_the_vocabulary_size_as_perplexity(tiny_model):
    # Zero embeddings (tied to the head) give all-zero logits: a uniform guess.
    torch.nn.init.zeros_(tiny_model.model.embed_tokens.weight)
    result = perplexity(tiny_model, TOKENS, window=5)
    assert result.perplexity == pytest.approx(tiny_model.config.vocab_size)
    # Windows of 5, 5 and 4 tokens score all but their first.
    assert result.tokens == len(TOKENS) - 3


def test_each_window_is_scored_on_its_own_like_a_dense_forward(tiny_model):
    result = perplexity(tiny_model, TOKENS, window=6)
    nll, count = 0.0, 0
    for start in range(0, len(TOKENS), 6):
        window = TOKENS[start : start + 6]
        logits = dense_logits(tiny_model, window)
        nll += F.cross_entropy(logits[:-1], torch.tensor(window[1:]), reduction="sum").item()
        count += len(window) - 1
    assert result.tokens == count
    assert result.mean_nll == pytest.approx(nll / count, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(nll / count), rel=1e-5)


def test_a_window_needs_two_tokens(tiny_model):
    with pytest.raises(ValueError, match="two tokens"):
        perplexity(tiny_model, TOKENS, window=1)


def test_the_shipped_text_is_there_and_long_enough_for_the_default_run():
    words = DEFAULT_TEXT.read_text(encoding="utf-8").split()
    assert len(words) > 3000 and words[:4] == ["Chapter", "1", "It", "is"]


class _ByteTokenizer:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode()]


@pytest.fixture
def tiny_cli(monkeypatch, tiny_model, tmp_path):
    """The CLI over the tiny model: no weights file, a byte tokenizer."""
    monkeypatch.setattr(cli, "resolve_model_path", lambda path: tmp_path / "tiny")
    monkeypatch.setattr(
        cli, "load_tokenizer", lambda path: _ByteTokenizer(tiny_model.config.vocab_size)
    )
    monkeypatch.setattr(cli, "load_model", lambda *args, **kwargs: (tiny_model, None))


def run_cli(capsys, *flags: str) -> tuple[int, dict]:
    code = cli.main(["perplexity", "--max-tokens", "60", "--window", "12", "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def test_int8_is_gated_at_one_percent_against_float32(tiny_cli, capsys):
    code, report = run_cli(capsys, "--quantization", "int8")
    assert report["baseline"]["dtype"] == "float32"
    assert report["baseline"]["tokens"] == 60 - 5
    assert report["candidate"]["quantization"] == "int8"
    expected = 100 * (report["candidate"]["perplexity"] / report["baseline"]["perplexity"] - 1)
    assert report["delta_pct"] == pytest.approx(expected)
    assert report["max_delta_pct"] == 1.0
    assert code == (0 if report["delta_pct"] <= 1.0 else 1) and report["passed"] == (code == 0)
    assert report["weight_memory"]["ratio_vs_float32"] > 3.5


def test_a_delta_over_the_limit_fails(tiny_cli, capsys):
    code, report = run_cli(capsys, "--quantization", "int4", "--max-delta", "-100")
    assert (code, report["passed"], report["max_delta_pct"]) == (1, False, -100)


def test_no_quantization_in_float32_reports_the_baseline_alone(tiny_cli, capsys):
    code, report = run_cli(capsys)
    assert code == 0 and "candidate" not in report and report["max_delta_pct"] is None


def test_the_text_report_names_both_runs_and_the_gate(tiny_cli, capsys):
    cli.main(["perplexity", "--max-tokens", "40", "--window", "12", "--quantization", "int8"])
    out = capsys.readouterr().out
    assert "float32   perplexity" in out and "int8 (float32)" in out and "gate" in out
