"""/v1/files and /v1/batches through the gateway's HTTP app and a batch worker, on the
stub cluster: the lifecycle, OpenAI's shapes, bad input, tenant isolation, and a
worker that dies mid-batch."""

import asyncio
import json

import pytest

from maas_services.common.openai_api.embeddings import MAX_INPUTS
from maas_services.gateway.admission.tenants import TenantStore
from maas_services.gateway.batches.batch_run import BATCH_PRIORITY
from maas_services.gateway.batches.file_store import FileLimits
from tests.integration.gateway.batches_api import (
    chat_line,
    embedding_line,
    jsonl,
    open_batches_api,
)
from tests.integration.gateway.conftest import CHUNKS, MODEL
from tests.integration.gateway.embedding_stubs import with_serves

TEXT = "".join(CHUNKS)


@pytest.fixture
async def api(make_cluster, redis_url, tmp_path):
    opened = []

    async def make(limits: FileLimits | None = None, **settings):
        cluster = await make_cluster(replicas=1, **settings)
        made, close = await open_batches_api(cluster.pipeline, redis_url, tmp_path, limits)
        made.cluster = cluster
        opened.append(close)
        return made

    yield make
    for close in opened:
        await close()


async def wait_for(api, batch_id: str, statuses=("completed", "failed", "expired", "cancelled")):
    for _ in range(1200):
        batch = (await api.get(f"/v1/batches/{batch_id}")).json()
        if batch["status"] in statuses:
            return batch
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch['status']}")


async def run_to_end(app, batch_id: str, **settings) -> dict:
    """The batch as it ends, run by a worker started for it and stopped after."""
    worker = app.worker(**settings)
    worker.start()
    try:
        return await wait_for(app, batch_id)
    finally:
        await worker.stop()


def lines_of(content: bytes) -> list[dict]:
    return [json.loads(line) for line in content.splitlines()]


async def test_a_batch_runs_to_completion_with_openais_files_and_shapes(api):
    app = await api()
    requests = [chat_line(f"req-{i}", MODEL, f"Hi {i}") for i in range(5)]
    uploaded = await app.upload(jsonl(requests))
    assert uploaded.status_code == 200, uploaded.text
    file = uploaded.json()
    assert file["object"] == "file"
    assert file["purpose"] == "batch"
    assert file["bytes"] == len(jsonl(requests))
    assert (await app.get(f"/v1/files/{file['id']}/content")).content == jsonl(requests)

    created = await app.create_batch(input_file_id=file["id"], metadata={"job": "nightly"})
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["object"] == "batch"
    assert batch["status"] == "in_progress"
    assert batch["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"job": "nightly"}

    done = await run_to_end(app, batch["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert done["error_file_id"] is None
    for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
        assert done[stamp] >= done["created_at"]
    output = lines_of((await app.get(f"/v1/files/{done['output_file_id']}/content")).content)
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(5)]
    for line in output:
        assert line["id"].startswith("batch_req_")
        assert line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["id"] == response["request_id"]
        assert response["body"]["choices"][0]["message"]["content"] == TEXT
    # Every line ran at the batch priority, below every tier's.
    assert app.cluster.engines[0].priorities == [BATCH_PRIORITY] * 5
    # Billed once per line, as batch lines, under ids derived from (batch, line).
    await app.pipeline.background.wait()
    events = await app.usage_events()
    assert sorted(e.request_id for e in events) == [f"{batch['id']}:{n}" for n in range(1, 6)]
    assert {e.batch_id for e in events} == {batch["id"]}


async def test_lines_a_model_refuses_are_error_lines(api):
    app = await api()
    requests = [chat_line("good", MODEL), chat_line("bad", "no-such-model")]
    file = (await app.upload(jsonl(requests))).json()
    batch = (await app.create_batch(input_file_id=file["id"])).json()
    done = await run_to_end(app, batch["id"])
    assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    [error] = lines_of((await app.get(f"/v1/files/{done['error_file_id']}/content")).content)
    assert error["custom_id"] == "bad"
    assert error["response"]["status_code"] == 404
    assert error["response"]["body"]["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("content", "line", "param"),
    [
        (b'{"custom_id": "a", "method": "POST"', 1, "line"),
        (jsonl([chat_line("a", MODEL), chat_line("a", MODEL)]), 2, "custom_id"),
        (jsonl([chat_line("a", MODEL), {**chat_line("b", MODEL), "method": "GET"}]), 2, "method"),
        (jsonl([{**chat_line("a", MODEL), "url": "/v1/images"}]), 1, "url"),
        (jsonl([{**chat_line("a", MODEL), "body": {"messages": []}}]), 1, "body.model"),
        (
            jsonl([chat_line("a", MODEL), chat_line("b", MODEL, temperature=9)]),
            2,
            "body.temperature",
        ),
        (jsonl([chat_line("a", MODEL, stream=True)]), 1, "body.stream"),
        (b"\n" + jsonl([{**chat_line("a", MODEL), "custom_id": 7}]), 2, "custom_id"),
        (
            jsonl([embedding_line("a", MODEL, "Hi"), embedding_line("b", MODEL, [])]),
            2,
            "body.input",
        ),
        (
            jsonl([embedding_line("a", MODEL, "Hi", encoding_format="hex")]),
            1,
            "body.encoding_format",
        ),
    ],
)
async def test_a_bad_line_refuses_the_file_naming_its_line_and_field(api, content, line, param):
    app = await api()
    refused = await app.upload(content)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(f"Line {line} of the file")
    # Nothing stored, half-way or whole.
    assert (await app.get("/v1/files")).json()["data"] == []
    assert list(app.service.files.blobs.root.iterdir()) == []


async def test_uploads_over_the_file_limit_or_the_quotas_are_413_and_leave_nothing(api):
    line = jsonl([chat_line("a", MODEL, "x" * 200)])
    app = await api(FileLimits(max_file_bytes=2 * len(line), max_files=2, max_bytes=3 * len(line)))
    too_big = await app.upload(line * 3)
    assert too_big.status_code == 413
    assert too_big.json()["error"]["param"] == "file"
    assert (await app.upload(line)).status_code == 200
    assert (await app.upload(line)).status_code == 200
    over_count = await app.upload(line)
    assert over_count.status_code == 413
    assert over_count.json()["error"]["code"] == "quota_exceeded"
    # The other tenant's quota is its own.
    assert (await app.upload(line, tenant=app.tenants[1])).status_code == 200
    files = (await app.get("/v1/files")).json()["data"]
    assert len(files) == 2
    # One deleted: room for one more, but not for bytes past the byte quota.
    assert (await app.client.delete(f"/v1/files/{files[0]['id']}", headers=app.auth())).json()[
        "deleted"
    ]
    over_bytes = await app.upload(jsonl([chat_line("b", MODEL, "y" * 2 * len(line))]))
    assert over_bytes.status_code == 413
    assert len(list(app.service.files.blobs.root.iterdir())) == 2


async def test_another_tenants_files_and_batches_are_404(api):
    app = await api()
    mine, theirs = app.tenants
    file = (await app.upload(jsonl([chat_line("a", MODEL)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"])).json()
    for path in (
        f"/v1/files/{file['id']}",
        f"/v1/files/{file['id']}/content",
        f"/v1/batches/{batch['id']}",
    ):
        assert (await app.get(path, tenant=theirs)).status_code == 404, path
    assert (await app.get("/v1/files", tenant=theirs)).json()["data"] == []
    assert (await app.get("/v1/batches", tenant=theirs)).json()["data"] == []
    stolen = await app.create_batch(tenant=theirs, input_file_id=file["id"])
    assert stolen.status_code == 404
    assert stolen.json()["error"]["param"] == "input_file_id"
    cancel = await app.client.post(
        f"/v1/batches/{batch['id']}/cancel", json={}, headers=app.auth(theirs)
    )
    assert cancel.status_code == 404
    deleted = await app.client.delete(f"/v1/files/{file['id']}", headers=app.auth(theirs))
    assert deleted.status_code == 404
    assert (await app.get(f"/v1/files/{file['id']}", tenant=mine)).status_code == 200


async def test_a_batch_for_an_unknown_or_other_endpoint_is_400_naming_it(api):
    app = await api()
    file = (await app.upload(jsonl([chat_line("a", MODEL)]))).json()
    unknown = await app.create_batch(input_file_id=file["id"], endpoint="/v1/images")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "endpoint"
    other = await app.create_batch(input_file_id=file["id"], endpoint="/v1/completions")
    assert other.status_code == 400
    assert other.json()["error"]["param"] == "endpoint"
    window = await app.create_batch(input_file_id=file["id"], completion_window="1h")
    assert window.status_code == 400
    assert window.json()["error"]["param"] == "completion_window"


async def test_batches_list_newest_first_in_pages(api):
    app = await api()
    file = (await app.upload(jsonl([chat_line("a", MODEL)]))).json()
    ids = [(await app.create_batch(input_file_id=file["id"])).json()["id"] for _ in range(3)]
    first = (await app.get("/v1/batches?limit=2")).json()
    assert first["object"] == "list"
    assert [b["id"] for b in first["data"]] == ids[::-1][:2]
    assert first["has_more"] is True
    rest = (await app.get(f"/v1/batches?limit=2&after={first['last_id']}")).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]]
    assert rest["has_more"] is False


async def test_a_cancelled_batch_ends_cancelled_with_its_unrun_lines_as_errors(api):
    app = await api()
    file = (await app.upload(jsonl([chat_line(f"r{i}", MODEL) for i in range(3)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"])).json()
    cancelling = await app.client.post(
        f"/v1/batches/{batch['id']}/cancel", json={}, headers=app.auth()
    )
    assert cancelling.json()["status"] == "cancelling"
    done = await run_to_end(app, batch["id"])
    assert done["status"] == "cancelled"
    assert done["output_file_id"] is None
    errors = lines_of((await app.get(f"/v1/files/{done['error_file_id']}/content")).content)
    assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 3
    assert app.cluster.engines[0].served == 0


async def test_lines_billed_by_a_worker_that_died_before_their_results_are_billed_once(api):
    """A worker that dies after its lines' bills are out but before it writes their
    results: another worker runs them again (its lease lapsed), and billing gets
    the same event twice per line: one id, one start, so its dedup bills it once."""
    app = await api(delay=0.05)
    file = (await app.upload(jsonl([chat_line(f"r{i}", MODEL) for i in range(4)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"])).json()
    dying = app.worker(lease_seconds=0.5, concurrency=4)
    # Dies after its lines' bills are out but before it writes a result.
    dying.batches = FailingAnswers(app.service.batches, lines=4)
    dying.start()
    for _ in range(1000):
        if len(await app.usage_events()) == 4:
            break
        await asyncio.sleep(0.02)
    await dying.stop()
    assert len(await app.usage_events()) == 4
    assert app.cluster.engines[0].served == 4
    done = await run_to_end(app, batch["id"], lease_seconds=0.5)
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    output = lines_of((await app.get(f"/v1/files/{done['output_file_id']}/content")).content)
    assert sorted(line["custom_id"] for line in output) == [f"r{i}" for i in range(4)]
    await app.pipeline.background.wait()
    events = await app.usage_events()
    # Both workers billed each line; the events are one per line (same id, same start).
    assert len(events) == 8
    assert len({(e.request_id, e.started_at) for e in events}) == 4


class FailingAnswers:
    """A BatchStore whose result writes never happen (the worker dies first), and
    which claims nothing more once `lines` lines were claimed: a dead worker does
    not come back for its own lapsed leases (under CI load the test's wait for the
    bills outlasted the 0.5 s lease and the same worker ran a line a second time)."""

    def __init__(self, store, lines: int):
        self._store = store
        self._left = lines

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def claim(self, owner: str, lease: float, limit: int):
        claimed = (
            await self._store.claim(owner, lease, min(limit, self._left)) if self._left else []
        )
        self._left -= len(claimed)
        return claimed

    async def answer(self, *args, **kwargs):
        raise RuntimeError("killed before the result was written")


async def test_a_worker_stopped_mid_batch_leaves_its_done_lines_done_and_bills_each_once(api):
    app = await api(delay=0.05)
    file = (await app.upload(jsonl([chat_line(f"r{i}", MODEL) for i in range(4)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"])).json()
    dying = app.worker(lease_seconds=0.5, concurrency=1)
    dying.start()
    for _ in range(2000):
        counts = (await app.get(f"/v1/batches/{batch['id']}")).json()["request_counts"]
        if counts["completed"] == 2:
            break
        await asyncio.sleep(0.01)
    # Stopped: its line in flight is cut short (and bills nothing) and put back.
    await dying.stop()
    served_before = app.cluster.engines[0].served
    done_before = (await app.get(f"/v1/batches/{batch['id']}")).json()["request_counts"]
    cut = served_before - done_before["completed"]
    assert done_before["completed"] >= 2
    assert cut in (0, 1)
    done = await run_to_end(app, batch["id"], lease_seconds=0.5)
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    # The lines done before the stop did not run again; the one cut short did.
    assert app.cluster.engines[0].served == 4 + cut
    await app.pipeline.background.wait()
    events = await app.usage_events()
    # One event per line, or two of the same (id, start) for a line whose bill was
    # out when it was stopped: billing's dedup key, so each line is billed once.
    keys = {(e.request_id, e.started_at) for e in events}
    assert sorted(key[0] for key in keys) == [f"{batch['id']}:{n}" for n in range(1, 5)]
    assert len(events) <= 4 + cut


async def test_a_batch_line_waits_while_an_interactive_request_holds_a_slot(api):
    app = await api()
    interactive = await app.cluster.complete()  # admitted: holds its slot until it ends
    file = (await app.upload(jsonl([chat_line("a", MODEL)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"])).json()
    worker = app.worker()
    worker.start()
    try:
        await asyncio.sleep(0.5)
        assert app.cluster.engines[0].served == 0
        assert (await app.get(f"/v1/batches/{batch['id']}")).json()["request_counts"][
            "completed"
        ] == 0
        async with interactive:
            async for _ in interactive.deltas:
                pass
        done = await wait_for(app, batch["id"])
    finally:
        await worker.stop()
    assert done["request_counts"]["completed"] == 1


async def test_an_interactive_request_arriving_beside_batch_lines_gets_a_slot_at_once(api):
    # Two slots; batch lines leave one (the reserve) to interactive requests.
    app = await api(delay=0.2, routes=f"deployments:\n  {MODEL}: {{max_in_flight: 2}}\n")
    file = (await app.upload(jsonl([chat_line(f"r{i}", MODEL) for i in range(3)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"])).json()
    worker = app.worker(concurrency=3)
    worker.start()
    try:
        for _ in range(200):
            if app.cluster.engines[0].active:
                break
            await asyncio.sleep(0.01)
        queue = next(iter(app.pipeline.queues._queues.values()))
        assert queue.in_use == 1  # one batch line: the other slot is the reserve
        interactive = await asyncio.wait_for(app.cluster.complete(), 0.1)
        assert queue.in_use == 2
        async with interactive:
            async for _ in interactive.deltas:
                pass
        done = await wait_for(app, batch["id"])
    finally:
        await worker.stop()
    assert done["request_counts"]["completed"] == 3


async def test_an_embeddings_batch_answers_what_the_route_does_billing_each_input(api, monkeypatch):
    with_serves(monkeypatch)
    app = await api()
    bodies = [
        {"input": "The cat sat."},
        {"input": ["Hello there", "General Kenobi"]},
        {"input": "Base sixty four", "encoding_format": "base64"},
    ]
    requests = [embedding_line(f"e{i}", MODEL, **body) for i, body in enumerate(bodies)]
    file = (await app.upload(jsonl(requests))).json()
    created = await app.create_batch(input_file_id=file["id"], endpoint="/v1/embeddings")
    assert created.status_code == 200, created.text
    batch = created.json()
    done = await run_to_end(app, batch["id"])
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    output = lines_of((await app.get(f"/v1/files/{done['output_file_id']}/content")).content)
    assert [line["custom_id"] for line in output] == ["e0", "e1", "e2"]
    for line, body in zip(output, bodies, strict=True):
        direct = await app.client.post(
            "/v1/embeddings", json={"model": MODEL, **body}, headers=app.auth()
        )
        assert direct.status_code == 200, direct.text
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"] == direct.json()
    assert isinstance(output[2]["response"]["body"]["data"][0]["embedding"], str)
    # One usage event per input, as batch lines, under (batch, line, input index).
    await app.pipeline.background.wait()
    billed = [e for e in await app.usage_events() if e.batch_id == batch["id"]]
    assert sorted(e.request_id for e in billed) == [
        f"{batch['id']}:{n}" for n in ("1:0", "2:0", "2:1", "3:0")
    ]
    assert all(e.completion_tokens == 0 for e in billed)


async def test_an_embeddings_line_run_again_after_its_worker_stopped_bills_each_input_once(
    api, monkeypatch
):
    with_serves(monkeypatch)
    app = await api()
    engine = app.cluster.engines[0]
    # Each input's time: the window, after the first is billed, in which the worker must be
    # seen stopping before the third starts (0.2 s was missed once on a loaded 2-core CI).
    engine.embed_delay = 1.0
    inputs = ["one", "two", "three"]
    file = (await app.upload(jsonl([embedding_line("e", MODEL, inputs)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"], endpoint="/v1/embeddings")).json()
    dying = app.worker(lease_seconds=0.5, concurrency=1)
    dying.start()
    for _ in range(1000):
        if await app.usage_events():
            break
        await asyncio.sleep(0.01)
    # Stopped mid-line: its first input billed, the rest not yet.
    await dying.stop()
    assert 1 <= len(engine.embedded) < len(inputs)
    engine.embed_delay = 0.0
    done = await run_to_end(app, batch["id"])
    assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    # The line ran again from its first input; each input's events share one
    # (id, start), billing's dedup key, so each input is billed once.
    await app.pipeline.background.wait()
    events = await app.usage_events()
    keys = {(e.request_id, e.started_at) for e in events}
    assert sorted(key[0] for key in keys) == [f"{batch['id']}:1:{i}" for i in range(3)]
    assert {e.batch_id for e in events} == {batch["id"]}


async def test_the_largest_embeddings_line_costs_only_its_sender(api, monkeypatch):
    """A line of MAX_INPUTS inputs holds one slot, one input at a time, while another
    tenant's requests find the reserve free and are all served before it ends."""
    with_serves(monkeypatch)
    app = await api(routes=f"deployments:\n  {MODEL}: {{max_in_flight: 2}}\n")
    engine = app.cluster.engines[0]
    engine.embed_delay = 0.002
    inputs = [f"input {i}" for i in range(MAX_INPUTS)]
    file = (await app.upload(jsonl([embedding_line("big", MODEL, inputs)]))).json()
    batch = (await app.create_batch(input_file_id=file["id"], endpoint="/v1/embeddings")).json()
    worker = app.worker(quiet_seconds=0.05)
    worker.start()
    try:
        while len(engine.embedded) < 50:
            await asyncio.sleep(0.01)
        other = app.tenants[1]
        for _ in range(10):
            response = await app.client.post(
                "/v1/chat/completions",
                json=chat_line("x", MODEL)["body"],
                headers=app.auth(other),
            )
            assert response.status_code == 200, response.text
        assert (await app.get(f"/v1/batches/{batch['id']}")).json()["status"] == "in_progress"
        done = await wait_for(app, batch["id"])
    finally:
        await worker.stop()
    assert engine.embedding_peak == 1
    assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    [line] = lines_of((await app.get(f"/v1/files/{done['output_file_id']}/content")).content)
    assert len(line["response"]["body"]["data"]) == MAX_INPUTS
    await app.pipeline.background.wait()
    assert len([e for e in await app.usage_events() if e.batch_id == batch["id"]]) == MAX_INPUTS


async def test_an_embeddings_line_within_the_keys_limits_is_never_refused_for_itself(
    api, monkeypatch
):
    """Inputs go one at a time, each after the last one's lease has ended, so a key
    with max_concurrency 1 embeds a list; a list longer than the key's RPM is the
    line's 400 at once rather than a refusal part-way on every attempt."""
    with_serves(monkeypatch)
    app = await api()
    await TenantStore(app.redis).update_tenant(app.tenants[0], rpm=3, max_concurrency=1)
    lines = [
        embedding_line("fits", MODEL, ["a", "b", "c"]),
        embedding_line("over", MODEL, ["a"] * 4),
    ]
    file = (await app.upload(jsonl(lines))).json()
    batch = (await app.create_batch(input_file_id=file["id"], endpoint="/v1/embeddings")).json()
    done = await run_to_end(app, batch["id"])
    assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    [ok] = lines_of((await app.get(f"/v1/files/{done['output_file_id']}/content")).content)
    assert ok["custom_id"] == "fits"
    assert len(ok["response"]["body"]["data"]) == 3
    [error] = lines_of((await app.get(f"/v1/files/{done['error_file_id']}/content")).content)
    assert error["custom_id"] == "over"
    assert error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "body.input"
    assert len(app.cluster.engines[0].embedded) == 3
