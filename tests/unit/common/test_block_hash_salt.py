"""Per-request salts: tenants never share prefix-cache blocks unless both keys allow it."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maas_services.common.block_hash import prefix_block_hashes, request_salt

TOKENS = list(range(64))


def blocks(tenant: str, sharing: str = "tenant", share: bool = False) -> list[int]:
    return prefix_block_hashes(TOKENS, 16, request_salt("m", sharing, tenant, share))


def test_tenants_get_different_blocks():
    assert set(blocks("a")).isdisjoint(blocks("b"))
    assert blocks("a") == blocks("a")


@pytest.mark.parametrize(
    ("sharing", "share"), [("tenant", False), ("tenant", True), ("global", False)]
)
def test_a_request_shares_only_where_the_engine_allows_and_it_asks(sharing, share):
    assert set(blocks("a", sharing, share)).isdisjoint(blocks("b", sharing, share))


def test_requests_that_share_get_the_engines_own_salt():
    assert blocks("a", "global", True) == blocks("b", "global", True)
    assert request_salt("m", "global", "a", True) == "m"


def test_no_tenant_is_a_scope_of_its_own_not_the_shared_one():
    assert set(blocks("")).isdisjoint(blocks("a"))
    assert set(blocks("")).isdisjoint(blocks("x", "global", True))


@given(st.text(), st.text(), st.text())
def test_distinct_tenants_never_share_a_salt(engine_salt, a, b):
    engine_salt = engine_salt.replace("\x00", "")  # no flag or environment value holds NUL
    if a != b:
        assert request_salt(engine_salt, "tenant", a, False) != request_salt(
            engine_salt, "tenant", b, False
        )
    assert request_salt(engine_salt, "tenant", a, False) != engine_salt


def test_an_adapters_blocks_are_its_own():
    base = request_salt("m", "global", "a", True)
    assert request_salt("m", "global", "a", True, adapter="upper") != base
    assert request_salt("m", "global", "a", True, adapter="upper") != request_salt(
        "m", "global", "a", True, adapter="lower"
    )
    # Sharing across tenants still holds within one adapter.
    assert request_salt("m", "global", "a", True, "upper") == request_salt(
        "m", "global", "b", True, "upper"
    )
