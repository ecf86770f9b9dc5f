"""Request migration in the gateway, over stub engines that resume and die on demand.

The engines here speak the real Engine protocol on loopback and continue a
request from its resume_token_ids as a real engine does (the real engine's
side is tests/integration/engine/test_resume.py; kills of real engine
processes are test_migration_real.py). What is checked is the gateway's:
one uninterrupted stream, each token billed once, the re-prefill counted as
the platform's, the limit, and the ends that cannot migrate.
"""

import asyncio
import uuid
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client import REGISTRY

from maas.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from maas_services.common.engine_metadata import SCHEDULED
from maas_services.gateway.admission.tenants import Principal, Tenant
from tests.integration.gateway.conftest import MODEL, StubCluster, parsed
from tests.integration.gateway.stubs import StubEngine, StubRouter, start
from tests.integration.gateway.test_prefill_billing import billed

WORDS = [f" w{i}" for i in range(12)]
PROMPT = [7, 8, 9, 10]


class ResumingEngine(StubEngine):
    """Streams WORDS (token i+1 is word i), continuing after resume_token_ids.

    `die_after`: once that many words of a request are out, abort with
    `dies_with` (what a dead core's stream gets); `stall_after`: stop there
    until the server is stopped under it. Every request says it was scheduled.
    """

    def __init__(self):
        super().__init__(MODEL, WORDS)
        self.die_after: int | None = None
        self.dies_with = grpc.StatusCode.UNAVAILABLE
        self.resumes: list[list[int]] = []
        self.stalled = asyncio.Event()

    async def Generate(self, request, context):
        await context.send_initial_metadata(SCHEDULED)
        resume = list(request.resume_token_ids)
        self.resumes.append(resume)
        limit = request.sampling.max_tokens or len(WORDS)
        end = min(limit, len(WORDS))
        for i in range(len(resume), end):
            if i == self.die_after:
                await context.abort(self.dies_with, "engine core died")
            if i == self.stall_after:
                self.stalled.set()
                await asyncio.Event().wait()
            response = engine_pb2.GenerateResponse(
                request_id=request.request_id, token_ids=[i + 1], text=WORDS[i]
            )
            if i == end - 1:
                response.finish_reason = (
                    common_pb2.FINISH_REASON_LENGTH
                    if end < len(WORDS)
                    else common_pb2.FINISH_REASON_STOP
                )
                response.usage.CopyFrom(
                    common_pb2.Usage(
                        prompt_tokens=len(request.prompt_token_ids), completion_tokens=i + 1
                    )
                )
            yield response
            await asyncio.sleep(0.001)


@dataclass
class Migrating:
    cluster: StubCluster
    engines: list[ResumingEngine]
    servers: list[grpc.aio.Server]
    redis_url: str

    @property
    def router(self) -> StubRouter:
        return self.cluster.router


@pytest.fixture
async def resuming(make_cluster, redis_url):
    """make(replicas, **settings) -> Migrating: every replica a ResumingEngine;
    the router picks e0 first, then the others in turn."""
    servers = []

    async def make(replicas: int = 2, **settings) -> Migrating:
        cluster = await make_cluster(replicas=0, **settings)
        engines, mine = [], []
        for index in range(replicas):
            engine = ResumingEngine()
            server, address = await start(engine, engine_pb2_grpc.add_EngineServicer_to_server)
            servers.append(server)
            mine.append(server)
            engines.append(engine)
            cluster.router.endpoints.append((f"e{index}", address, MODEL))
        return Migrating(cluster, engines, mine, redis_url)

    yield make
    for server in servers:
        await server.stop(0)


async def stream(m: Migrating, **request):
    """(the deltas the client got, its usage event)."""
    tenant = Tenant(name=f"mig-{uuid.uuid4().hex[:8]}", tpm=10_000_000)
    request = parsed(prompt=PROMPT, **request)
    run = await m.cluster.pipeline.admit(Principal(tenant, "key_test"), request)
    async with run:
        deltas = [delta async for delta in run.deltas]
    await m.cluster.pipeline.background.wait()
    event, _, _ = await billed(m.redis_url, tenant.name, request.request_id)
    return deltas, event


def text_of(deltas) -> str:
    return "".join(d.text for d in deltas)


def migrations(outcome: str) -> float:
    return REGISTRY.get_sample_value("maas_gateway_migrations_total", {"outcome": outcome}) or 0.0


def prefill_counted() -> float:
    return REGISTRY.get_sample_value("maas_gateway_migration_prefill_tokens_total") or 0.0


async def test_a_stream_whose_engine_dies_goes_on_from_another_replica(resuming):
    m = await resuming()
    engines = m.engines
    engines[0].die_after = 5
    resumed, prefill = migrations("resumed"), prefill_counted()

    deltas, event = await stream(m)

    assert text_of(deltas) == "".join(WORDS)
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["stop"]
    assert deltas[-1].completion_tokens == len(WORDS)
    # The replica it moved to was sent what the client had, nothing more or less.
    assert m.router.picks == ["e0", "e1"]
    assert engines[1].resumes == [[1, 2, 3, 4, 5]]
    # Billed once: the prompt and every token; the re-prefill is the platform's.
    assert (event.prompt_tokens, event.completion_tokens) == (len(PROMPT), len(WORDS))
    assert (event.finish_reason, event.endpoint) == ("stop", "e1")
    assert event.migration_prefill_tokens == len(PROMPT) + 5
    assert migrations("resumed") == resumed + 1
    assert prefill_counted() - prefill == len(PROMPT) + 5
    # The router heard of the failure at once, from the gateway.
    assert m.router.releases == [event.request_id]


async def test_an_engine_dying_in_a_step_before_the_first_token_is_migrated(resuming):
    m = await resuming()
    engines = m.engines
    engines[0].die_after = 0
    deltas, event = await stream(m)
    assert text_of(deltas) == "".join(WORDS)
    assert engines[1].resumes == [[]]
    assert (event.prompt_tokens, event.completion_tokens) == (len(PROMPT), len(WORDS))
    assert event.migration_prefill_tokens == len(PROMPT)


async def test_a_drain_that_outlasts_its_grace_migrates(resuming):
    m = await resuming()
    engines, servers = m.engines, m.servers
    engines[0].stall_after = 4
    request = asyncio.create_task(stream(m))
    await engines[0].stalled.wait()
    await servers[0].stop(0)  # the grace is over: the server cancels what it still runs
    deltas, event = await request
    assert text_of(deltas) == "".join(WORDS)
    assert engines[1].resumes == [[1, 2, 3, 4]]
    assert event.completion_tokens == len(WORDS)


async def test_past_the_limit_the_stream_ends_as_before(resuming):
    m = await resuming(replicas=3, max_migrations=1)
    engines = m.engines
    # The first replica dies after three words, whichever takes it on after six.
    engines[0].die_after = 3
    engines[1].die_after = engines[2].die_after = 6
    limited = migrations("limit")
    deltas, event = await stream(m)
    assert text_of(deltas) == "".join(WORDS[:6])
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["error"]
    assert len(m.router.picks) == 2
    # Billed by the rule for a request cut short: the prompt and what was delivered.
    assert (event.prompt_tokens, event.completion_tokens) == (len(PROMPT), 6)
    assert event.finish_reason == "error"
    assert event.migration_prefill_tokens == len(PROMPT) + 3
    assert migrations("limit") == limited + 1
    assert len(m.router.releases) == 2


async def test_with_nowhere_to_go_the_stream_ends_with_an_error_billed_as_cut_short(resuming):
    m = await resuming(replicas=1, hold_timeout_seconds=0.3)
    engines = m.engines
    engines[0].die_after = 4
    nowhere = migrations("no_replica")
    deltas, event = await stream(m)
    assert text_of(deltas) == "".join(WORDS[:4])
    assert deltas[-1].finish_reason == "error"
    assert (event.prompt_tokens, event.completion_tokens) == (len(PROMPT), 4)
    assert event.migration_prefill_tokens == 0
    assert migrations("no_replica") == nowhere + 1


async def test_a_replica_that_comes_within_the_hold_takes_the_request(resuming):
    m = await resuming(replicas=2, hold_timeout_seconds=30)
    engines = m.engines
    engines[0].die_after = 4
    standby = m.router.endpoints.pop()  # e1 is not ready yet
    request = asyncio.create_task(stream(m))
    while not m.router.releases:  # e0 has died under the request
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    m.router.endpoints.append(standby)
    deltas, event = await request
    assert text_of(deltas) == "".join(WORDS)
    assert engines[1].resumes == [[1, 2, 3, 4]]
    assert event.completion_tokens == len(WORDS)


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "not_migratable"),
        (grpc.StatusCode.INTERNAL, "not_migratable"),
    ],
)
async def test_a_failure_the_request_may_have_caused_is_not_migrated(resuming, code, outcome):
    m = await resuming()
    engines = m.engines
    engines[0].die_after, engines[0].dies_with = 4, code
    before = migrations(outcome)
    deltas, event = await stream(m)
    assert deltas[-1].finish_reason == "error"
    assert m.router.picks == ["e0"]
    assert event.completion_tokens == 4
    assert migrations(outcome) == before + 1


async def test_a_request_with_several_samples_is_not_migrated(resuming):
    m = await resuming()
    engines = m.engines
    engines[0].die_after = 4
    before = migrations("n_above_1")
    deltas, _ = await stream(m, n=2)
    assert deltas[-1].finish_reason == "error"
    assert m.router.picks == ["e0"]
    assert migrations("n_above_1") == before + 1


async def test_without_migrations_a_dying_engine_cuts_the_stream(resuming):
    m = await resuming(max_migrations=0)
    engines = m.engines
    engines[0].die_after = 4
    deltas, event = await stream(m)
    assert deltas[-1].finish_reason == "error"
    assert event.completion_tokens == 4


async def test_a_client_gone_while_its_request_waits_for_a_replica_pays_what_it_got(resuming):
    m = await resuming(replicas=1, hold_timeout_seconds=30)
    m.engines[0].die_after = 4
    tenant = Tenant(name=f"mig-{uuid.uuid4().hex[:8]}", tpm=10_000_000)
    request = parsed(prompt=PROMPT)
    run = await m.cluster.pipeline.admit(Principal(tenant, "key_test"), request)
    seen = []

    async def read() -> None:
        async for delta in run.deltas:
            seen.append(delta)

    reading = asyncio.create_task(read())
    while not m.router.releases:  # e0 died: the request waits for another replica
        await asyncio.sleep(0.01)
    reading.cancel()  # the client leaves
    await asyncio.gather(reading, return_exceptions=True)
    await run.close()
    await m.cluster.pipeline.background.wait()
    event, _, _ = await billed(m.redis_url, tenant.name, request.request_id)
    assert text_of(seen) == "".join(WORDS[:4])
    assert (event.prompt_tokens, event.completion_tokens) == (len(PROMPT), 4)
    assert event.finish_reason == "client_disconnect"
