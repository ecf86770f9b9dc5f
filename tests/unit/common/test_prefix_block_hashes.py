"""The router's whole-prompt hashes are the engine's block-by-block ones, bit for bit."""

from hypothesis import given
from hypothesis import strategies as st

from maas_services.common.block_hash import hash_block, prefix_block_hashes


def chained(token_ids: list[int], block_size: int, salt: str) -> list[int]:
    hashes, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], salt)
        hashes.append(parent)
    return hashes


@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=200),
    st.integers(1, 33),
    st.text(max_size=20),
)
def test_whole_prompt_hashes_equal_the_chained_blocks(token_ids, block_size, salt):
    assert prefix_block_hashes(token_ids, block_size, salt) == chained(token_ids, block_size, salt)


def test_the_values_engines_and_routers_already_agree_on():
    # Computed by a959bdc's block-by-block code: a change here splits the two sides.
    assert prefix_block_hashes(list(range(40)), 16, "m\x00tenant") == [
        10535869198770013695,
        18214298491960107058,
    ]
    assert prefix_block_hashes([49151] * 16, 16, "é") == [6752118336476530450]


def test_only_full_blocks_are_read():
    # An id no block holds is never packed, as before.
    assert prefix_block_hashes([1] * 16 + [-1], 16) == prefix_block_hashes([1] * 16, 16)
