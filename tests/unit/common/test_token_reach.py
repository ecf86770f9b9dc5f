"""How many characters a token can cover: known for byte-level BPE, else no bound."""

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from maas_services.common.token_reach import max_token_chars


def test_smollm2_bound_is_its_longest_vocabulary_entry(tokenizer):
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    assert tokenizer.max_token_chars == max(map(len, vocab)) == 81


def test_no_text_encodes_to_fewer_tokens_than_the_bound_says(tokenizer):
    # The longest token's own text, over and over: the fewest tokens per character.
    longest = max(tokenizer.tokenizer.get_vocab(), key=len)
    text = tokenizer.decode([tokenizer.tokenizer.token_to_id(longest)]) * 50
    assert len(tokenizer.encode(text)) >= len(text) / tokenizer.max_token_chars


def byte_level(**changes) -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = changes.get("pre_tokenizer", pre_tokenizers.ByteLevel())
    if "normalizer" in changes:
        tokenizer.normalizer = changes["normalizer"]
    if "added" in changes:
        tokenizer.add_special_tokens([changes["added"]])
    return tokenizer


def then_byte_level(first) -> pre_tokenizers.Sequence:
    return pre_tokenizers.Sequence([first, pre_tokenizers.ByteLevel()])


def test_plain_byte_level_vocabulary_is_bounded():
    assert max_token_chars(byte_level(added=AddedToken("<|end|>", special=True))) == 7
    digits = then_byte_level(pre_tokenizers.Digits(individual_digits=True))
    assert max_token_chars(byte_level(pre_tokenizer=digits)) == 1


@pytest.mark.parametrize(
    "changes",
    [
        # NFC merges "e" + U+0301 into one character.
        {"normalizer": normalizers.NFC()},
        # Whitespace splitting drops the spaces themselves.
        {"pre_tokenizer": then_byte_level(pre_tokenizers.Whitespace())},
        {"pre_tokenizer": then_byte_level(pre_tokenizers.Split(" ", behavior="removed"))},
        # An lstrip token also swallows every space before it.
        {"added": AddedToken("<mask>", special=True, lstrip=True)},
    ],
    ids=["normalizer", "whitespace", "removing-split", "lstrip"],
)
def test_tokenizers_that_drop_or_merge_characters_have_no_bound(changes):
    assert max_token_chars(byte_level(**changes)) is None
