import hashlib
import struct

import pytest

from maas_services.common.block_hash import hash_block, prefix_block_hashes


def test_known_value_is_pinned():
    # The router and every engine replica must agree; a change here breaks
    # prefix-aware routing across a mixed-version rollout.
    assert hash_block(None, [1, 2, 3, 4]) == 10290178837488595690
    assert hash_block(None, [1, 2, 3, 4], salt="m") == 18311514196333902111


def test_byte_encoding():
    parent = 3223290064467969992
    salt = "llama-3"
    expected = hashlib.blake2b(
        b"\x01"
        + parent.to_bytes(8, "little")
        + len(salt).to_bytes(4, "little")
        + salt.encode()
        + struct.pack("<3I", 7, 8, 2**32 - 1),
        digest_size=8,
    ).digest()
    assert hash_block(parent, [7, 8, 2**32 - 1], salt) == int.from_bytes(expected, "little")


def test_is_unsigned_64_bit():
    for tokens in ([0], [1, 2], list(range(16))):
        assert 0 <= hash_block(None, tokens) < 2**64


def test_no_parent_differs_from_parent_zero():
    assert hash_block(None, [1, 2]) != hash_block(0, [1, 2])


def test_chaining_depends_on_the_parent():
    first_a = hash_block(None, [1, 2])
    first_b = hash_block(None, [3, 4])
    assert hash_block(first_a, [5, 6]) != hash_block(first_b, [5, 6])


def test_salt_changes_hashes():
    assert hash_block(None, [1, 2]) != hash_block(None, [1, 2], salt="other-model")
    assert prefix_block_hashes([1, 2, 3, 4], 2, salt="a") != prefix_block_hashes(
        [1, 2, 3, 4], 2, salt="b"
    )


def test_salt_cannot_pose_as_tokens():
    # Without the salt's length prefix these two would hash the same bytes.
    assert hash_block(None, [1], salt="") != hash_block(None, [], salt="\x01\x00\x00\x00")


def test_prefix_block_hashes_chain_full_blocks_and_ignore_a_partial_tail():
    first = hash_block(None, [1, 2, 3])
    second = hash_block(first, [4, 5, 6])
    assert prefix_block_hashes([1, 2, 3, 4, 5, 6], 3) == [first, second]
    assert prefix_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 3) == [first, second]
    assert prefix_block_hashes([1, 2], 3) == []
    assert prefix_block_hashes([], 3) == []


def test_shared_prefix_gives_shared_leading_hashes():
    a = prefix_block_hashes([1, 2, 3, 4, 5, 6], 2)
    b = prefix_block_hashes([1, 2, 3, 4, 9, 9], 2)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_token_ids_out_of_uint32_range_are_rejected():
    with pytest.raises(struct.error):
        hash_block(None, [-1])
