"""The blocked-terms filter on a real engine stream, terms split across chunks."""

import pytest

CHUNKS = ["The secret is bl", "ueberry pie", " and more"]


@pytest.mark.parametrize(
    ("action", "text", "finish"),
    [
        ("mask", "The secret is ********* pie and more", "stop"),
        ("stop", "The secret is ", "content_filter"),
    ],
)
async def test_term_split_over_two_chunks_is_caught(make_cluster, action, text, finish):
    cluster = await make_cluster(
        replicas=1, chunks=CHUNKS, blocked_terms=["BlueBerry"], blocked_terms_action=action
    )
    deltas = await cluster.run()
    assert "".join(d.text for d in deltas) == text
    assert deltas[-1].finish_reason == finish
    assert deltas[-1].completion_tokens > 0
