"""The batch worker in each gateway process: claims lines, runs them, finalizes batches.

Workers scale with the gateway: each replica runs one, and they share the
work through SQL (batch_store.py): a line is claimed under a lease the worker
renews while the line runs (every lease/3); a worker that dies stops renewing,
and once the lease passes another worker runs the line again. Its result is
written once (BatchStore.answer) and billed once (batch_run.py).

A line runs as an interactive request of its batch's tenant would: the
endpoint's request (endpoints.py), Pipeline.admit with the tenant's limits,
then the route's answer (an embeddings line: each input so, in turn); only
the gate in front of admission (idle_capacity.py) and the engine priority
differ. Admission refusing for now (429, 503) puts the line back, due after
the refusal's Retry-After; a line that keeps failing so ends as an error line
after `max_attempts`. Other refusals (400, 404) are the line's answer, in
the error file as OpenAI writes them.
"""

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from maas_services.common.logging import get_logger
from maas_services.common.openai_api.errors import APIError, bad_request
from maas_services.common.openai_api.parsed_request import ParsedRequest
from maas_services.gateway.admission.tenants import Principal, Tenant, TenantStore
from maas_services.gateway.batches.batch_run import BatchRun
from maas_services.gateway.batches.batch_store import BatchStore, Claimed
from maas_services.gateway.batches.endpoints import endpoint_for
from maas_services.gateway.batches.file_store import OUTPUT_PURPOSE, FileStore, record
from maas_services.gateway.batches.idle_capacity import IdleCapacity
from maas_services.gateway.pipeline import Pipeline

log = get_logger(__name__)

RETRY_LATER = frozenset({429, 503})


@dataclass(frozen=True)
class WorkerSettings:
    concurrency: int = 4
    lease_seconds: float = 60.0
    poll_seconds: float = 1.0
    reserve_fraction: float = 0.5
    max_attempts: int = 5
    quiet_seconds: float = 1.0

    @classmethod
    def from_settings(cls, settings) -> "WorkerSettings":
        return cls(
            settings.batch_concurrency,
            settings.batch_lease_seconds,
            settings.batch_poll_seconds,
            settings.batch_reserve_fraction,
            settings.batch_max_attempts,
            settings.batch_quiet_seconds,
        )


def result_line(custom_id: str, status: int, request_id: str, body: dict | None) -> dict:
    """OpenAI's line in a batch's output or error file."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def unrun_line(custom_id: str, code: str, message: str) -> dict:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


@dataclass
class BatchWorker:
    batches: BatchStore
    files: FileStore
    pipeline: Pipeline
    tenants: TenantStore
    settings: WorkerSettings
    owner: str = field(default_factory=lambda: f"worker-{uuid.uuid4().hex[:12]}")
    # The lines running now, by their task.
    _tasks: dict[asyncio.Task, Claimed] = field(default_factory=dict, init=False)
    _main: asyncio.Task | None = field(default=None, init=False)
    _gate: IdleCapacity = field(init=False)
    # This replica's batch lines holding a slot, by deployment (the gate's count).
    _lines: Counter = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        self._gate = IdleCapacity(
            self.pipeline,
            self.settings.reserve_fraction,
            min(self.settings.poll_seconds, 0.05),
            self.settings.quiet_seconds,
        )

    def start(self) -> None:
        self._main = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop claiming; lines running now are cut short (billing nothing) and put
        back, due at once, for any worker to run. A worker killed instead leaves
        them to its leases, which pass."""
        running = dict(self._tasks)
        tasks = [t for t in (self._main, *running) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for line in running.values():
            with contextlib.suppress(Exception):
                await self.batches.put_back(line, self.owner, 0.0)

    async def _run(self) -> None:
        beat = asyncio.get_running_loop().create_task(self._heartbeat())
        free = asyncio.Semaphore(self.settings.concurrency)
        finalized = 0.0
        try:
            while True:
                if time.monotonic() - finalized >= self.settings.poll_seconds:
                    finalized = time.monotonic()
                    await self._finalize_ready()
                await free.acquire()
                try:
                    claimed = await self.batches.claim(self.owner, self.settings.lease_seconds, 1)
                except Exception:
                    log.exception("batch_claim_failed")
                    claimed = []
                if not claimed:
                    free.release()
                    await asyncio.sleep(self.settings.poll_seconds)
                    continue
                task = asyncio.get_running_loop().create_task(self._line(claimed[0]))
                self._tasks[task] = claimed[0]
                task.add_done_callback(lambda done: (self._tasks.pop(done, None), free.release()))
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_seconds / 3)
            try:
                await self.batches.renew(self.owner, self.settings.lease_seconds)
            except Exception:
                log.exception("batch_lease_renewal_failed")

    async def _line(self, line: Claimed) -> None:
        try:
            answer = await self._answer(line)
            if answer is None:
                return
            ok, result = answer
            if not await self.batches.answer(line, self.owner, ok, result):
                log.warning("batch_line_taken_over", batch_id=line.batch_id, line=line.line)
        except Exception:
            # Left to its lease: another claim runs it again.
            log.exception("batch_line_failed", batch_id=line.batch_id, line=line.line)

    async def _answer(self, line: Claimed) -> tuple[bool, dict] | None:
        """(ok, the result line); None when put back to run later."""
        if line.attempts > self.settings.max_attempts:
            return False, unrun_line(
                line.custom_id,
                "attempts_exhausted",
                f"the request could not be served in {self.settings.max_attempts} attempts",
            )
        raw = await self.files.blobs.read_all(line.input_file_id, line.offset, line.length)
        request = msgspec.json.decode(raw)
        request_id = ""
        try:
            endpoint = endpoint_for(request["url"])
            prepared = endpoint.prepare(request["body"])
            request_id = prepared.parsed.request_id
            tenant = await self.tenants.get_tenant(line.tenant)
            if tenant is None or not tenant.active:
                raise APIError(403, "The batch's tenant is disabled.", code="tenant_disabled")
            count = len(prepared.requests)
            if tenant.rpm and count > tenant.rpm:
                # An embeddings line: each input is a request against the RPM, so a
                # list longer than it would be refused part-way on every attempt.
                raise bad_request(
                    f"input has {count} items, and each counts as one request against "
                    f"this key's limit of {tenant.rpm} requests per minute.",
                    param="body.input",
                )
            admit = functools.partial(self._admitted, tenant, line)
            body = await endpoint.answer(admit, prepared, self.pipeline.output_filter)
        except APIError as exc:
            if exc.status in RETRY_LATER or exc.status >= 500:
                delay = float((exc.headers or {}).get("Retry-After", 1))
                await self.batches.put_back(line, self.owner, delay)
                return None
            return False, result_line(line.custom_id, exc.status, request_id, exc.body())
        return True, result_line(line.custom_id, 200, request_id, body)

    @contextlib.asynccontextmanager
    async def _admitted(
        self, tenant: Tenant, line: Claimed, parsed: ParsedRequest, index: int | None
    ) -> AsyncIterator[BatchRun]:
        """One request of `line` (the input `index` of an embeddings line) through
        the gate and admission, running as a BatchRun until the block ends."""
        async with self._gate.admitting(tenant, parsed.model, self._lines):
            run = await self.pipeline.admit(Principal(tenant, line.key_id), parsed)
        # Counted before the gate's next line can look (no await in between).
        deployment = run.ticket.route.deployment
        self._lines[deployment] += 1
        try:
            run = BatchRun.taking_over(run, line.batch_id, line.line, line.started_at, index)
            async with run:
                yield run
        finally:
            self._lines[deployment] -= 1

    async def _finalize_ready(self) -> None:
        try:
            ready = await self.batches.take_finished(self.owner, self.settings.lease_seconds)
            for batch_id in ready:
                await self._finalize(batch_id)
        except Exception:
            log.exception("batch_finalize_failed")

    async def _finalize(self, batch_id: str) -> None:
        """Write the output and error files (ids derived from the batch's, so a
        finalizer taking over rewrites the same), then the batch's end status."""
        batch, unrun = await self.batches.finishing(batch_id)
        status = (
            "cancelled" if batch.status == "cancelling" else "expired" if unrun else "completed"
        )
        unrun_code = f"batch_{status}"
        stem = batch_id.removeprefix("batch_")
        out_id, err_id = f"file-{stem}-output", f"file-{stem}-errors"
        out, err = self.files.blobs.writer(out_id), self.files.blobs.writer(err_id)
        sizes = {out_id: 0, err_id: 0}
        try:
            async for ok, custom_id, result in self.batches.results(batch_id):
                if ok is None:
                    result = json.dumps(
                        unrun_line(custom_id, unrun_code, f"the batch was {status} first")
                    )
                target, target_id = (out, out_id) if ok else (err, err_id)
                data = result.encode() + b"\n"
                sizes[target_id] += len(data)
                await target.write(data)
            await out.commit()
            await err.commit()
        except BaseException:
            await out.discard()
            await err.discard()
            raise
        kept = {}
        for file_id, size in sizes.items():
            if size:
                name = f"{batch_id}_{file_id.rsplit('-', 1)[1]}.jsonl"
                await self.files.replace(record(file_id, batch.tenant, OUTPUT_PURPOSE, name, size))
                kept[file_id] = file_id
            else:
                await self.files.blobs.delete(file_id)
        await self.batches.finish(batch_id, self.owner, status, kept.get(out_id), kept.get(err_id))
        log.info("batch_finalized", batch_id=batch_id, status=status)
