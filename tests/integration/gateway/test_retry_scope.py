"""Which failed attempts the gateway sends to another replica.

Only requests that never reached an engine step: one that did may be what
broke it, and retrying it would let one request visit every replica.
"""

import grpc
import pytest

from maas_services.common.openai_api.errors import APIError
from tests.integration.gateway.conftest import CHUNKS


def text_of(deltas) -> str:
    return "".join(d.text for d in deltas)


async def test_a_request_that_reached_a_step_is_not_retried(make_cluster):
    cluster = await make_cluster()
    for engine in cluster.engines:
        engine.scheduled, engine.fail = True, grpc.StatusCode.INTERNAL
    with pytest.raises(APIError) as caught:
        await cluster.run()
    assert caught.value.status == 502
    assert len(cluster.router.picks) == 1


async def test_a_first_token_timeout_after_a_step_is_not_retried(make_cluster):
    cluster = await make_cluster(first_token_timeout_seconds=0.3)
    for engine in cluster.engines:
        engine.scheduled, engine.hang = True, True
    with pytest.raises(APIError) as caught:
        await cluster.run()
    assert caught.value.status == 504
    assert len(cluster.router.picks) == 1


async def test_a_failure_before_any_step_is_still_retried(make_cluster):
    cluster = await make_cluster()
    cluster.engines[0].fail = grpc.StatusCode.INTERNAL
    assert text_of(await cluster.run()) == "".join(CHUNKS)
    assert cluster.router.picks == ["e0", "e1"]


async def test_a_request_the_engine_blamed_on_itself_leaves_the_breaker_closed(make_cluster):
    cluster = await make_cluster(replicas=1, breaker_failures=1)
    engine = cluster.engines[0]
    engine.scheduled, engine.fail = True, grpc.StatusCode.INVALID_ARGUMENT
    for _ in range(3):
        with pytest.raises(APIError) as caught:
            await cluster.run()
        assert caught.value.status == 400
    engine.fail = None
    # An open breaker would leave the only replica out of the pick: 503.
    assert text_of(await cluster.run()) == "".join(CHUNKS)
