"""A replica that failed its start-up known-answer check says so on /metrics."""

from prometheus_client import REGISTRY

from maas_services.engine.known_answer_gauge import KNOWN_ANSWER_FAILED
from maas_services.engine.server import stay_not_serving


class Handle:
    serving = True

    async def set_serving(self, serving: bool) -> None:
        self.serving = serving


async def test_staying_not_serving_sets_the_gauge():
    assert REGISTRY.get_sample_value("maas_engine_known_answer_failed") == 0
    handle = Handle()
    try:
        await stay_not_serving(handle, "greedy answer differs")
        assert REGISTRY.get_sample_value("maas_engine_known_answer_failed") == 1
    finally:
        KNOWN_ANSWER_FAILED.set(0)
    assert handle.serving is False
