"""The worst upload one tenant can send: a file at the 200 MB limit, streamed, while
it opens more uploads and another tenant uploads too. The gateway's memory does
not grow with the file (RSS sampled through the upload), the tenant's extra
uploads are refused (429), and the other tenant's upload is served meanwhile."""

import asyncio
import json
import os
import threading

import pytest

from maas_services.gateway.batches.file_store import FileLimits
from tests.integration.gateway.batches_api import chat_line, jsonl, open_batches_api
from tests.integration.gateway.conftest import MODEL

LIMIT = 200 * 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")
BOUNDARY = "maasworstcaseboundary"


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class PeakRss:
    """The process's largest RSS while it runs, sampled every few milliseconds."""

    def __init__(self):
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


async def multipart_body(size: int, lines_of: int):
    """A multipart upload of `size` bytes of JSONL, made as it is sent (never held)."""
    yield (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    template = json.dumps(chat_line("{id}", MODEL, "{pad}"))
    sent, number, pending = 0, 0, []
    while sent < size:
        line = template.replace("{id}", f"line-{number:06d}")
        pad = max(min(lines_of, size - sent) - len(line) + len("{pad}") - 1, 1)
        line = line.replace("{pad}", "x" * pad).encode() + b"\n"
        pending.append(line)
        sent += len(line)
        number += 1
        if len(pending) == 16:
            yield b"".join(pending)
            pending = []
            await asyncio.sleep(0)
    yield b"".join(pending) + f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.mark.slow
async def test_a_200_mb_upload_costs_its_sender_not_the_gateways_memory(
    make_cluster, redis_url, tmp_path
):
    cluster = await make_cluster(replicas=1)
    # Lines of 4.4 kB: 200 MB in about 47,700 of them, under the 50,000 a file may hold.
    app, close = await open_batches_api(
        cluster.pipeline, redis_url, tmp_path, FileLimits(max_bytes=2 * LIMIT)
    )
    heavy, other = app.tenants
    headers = {**app.auth(heavy), "content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    try:
        baseline = rss()
        with PeakRss() as peak:
            big = [
                asyncio.create_task(
                    app.client.post(
                        "/v1/files",
                        content=multipart_body(LIMIT - 4096, 4400),
                        headers=headers,
                    )
                )
                for _ in range(2)
            ]
            await asyncio.sleep(0.5)
            # A third at once is over the tenant's uploads in flight.
            third = await app.upload(jsonl([chat_line("a", MODEL)]), tenant=heavy)
            assert third.status_code == 429
            # Another tenant is served meanwhile.
            small = await app.upload(jsonl([chat_line("a", MODEL)]), tenant=other)
            assert small.status_code == 200, small.text
            assert not all(task.done() for task in big)
            answers = await asyncio.gather(*big)
        for answer in answers:
            assert answer.status_code == 200, answer.text
            assert answer.json()["bytes"] <= LIMIT
        grown = peak.peak - baseline
        # Two 200 MB files streamed at once; a buffered upload would hold them whole.
        assert grown < 48 * 1024 * 1024, f"RSS grew {grown / 2**20:.0f} MiB"
        # One byte over the limit is refused, and nothing of it is kept.
        over = await app.client.post(
            "/v1/files", content=multipart_body(LIMIT + 1, 4400), headers=headers
        )
        assert over.status_code == 413
        kept = sorted(p.name for p in app.service.files.blobs.root.iterdir())
        assert len(kept) == 3 and not any(name.endswith(".part") for name in kept)
    finally:
        await close()
