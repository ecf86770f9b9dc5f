"""POST /v1/files: a multipart upload streamed to the blob store, checked as it comes.

Each received chunk is parsed (multipart.py), its file bytes checked line by
line (jsonl_check.py) and appended to the blob (blob_store.py), then dropped:
the upload holds one chunk and the unfinished line, whatever the file's size.
It stops at the first of: the per-file limit (413), the tenant's byte or file
quota (413), a bad line (400 naming it), a body not sent within the read
timeout between chunks (408), the client gone. Any of them discards the
partial blob; the file's row is written only once the blob is complete, in a
transaction that checks the quotas again (uploads racing on other replicas).
"""

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from starlette.types import Receive, Scope

from maas_services.common.openai_api.errors import APIError, bad_request
from maas_services.gateway.admission.tenants import Tenant
from maas_services.gateway.batches.file_store import (
    UPLOAD_PURPOSE,
    FileRecord,
    FileStore,
    new_file_id,
    over_quota,
    record,
)
from maas_services.gateway.batches.jsonl_check import JsonlCheck
from maas_services.gateway.batches.multipart import (
    MultipartReader,
    PartEnd,
    PartStart,
    boundary_of,
)

# Room for the multipart framing and the purpose field around the file.
FRAMING_BYTES = 64 * 1024
MAX_FIELD_BYTES = 256


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"The file is larger than {limit} bytes, the per-file limit.",
        param="file",
        code="file_too_large",
    )


@dataclass
class Uploads:
    store: FileStore
    read_timeout: float
    # Uploads streaming now on this replica, per tenant.
    _open: Counter = field(default_factory=Counter, init=False)

    async def receive_file(self, scope: Scope, receive: Receive, tenant: Tenant) -> FileRecord:
        limits = self.store.limits
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        boundary = boundary_of(headers.get("content-type", ""))
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_file_bytes + FRAMING_BYTES:
            raise too_large(limits.max_file_bytes)
        if self._open[tenant.name] >= limits.max_uploads:
            raise APIError(
                429,
                f"You are uploading {limits.max_uploads} files already; wait for one to finish.",
                type="requests",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        self._open[tenant.name] += 1
        try:
            count, used = await self.store.usage(tenant.name)
            self.store.check_quota(count, used, 0)
            return await self._stream(receive, boundary, tenant.name, used)
        finally:
            self._open[tenant.name] -= 1
            if not self._open[tenant.name]:
                del self._open[tenant.name]

    async def _stream(
        self, receive: Receive, boundary: bytes, tenant: str, used: int
    ) -> FileRecord:
        limits = self.store.limits
        file_id = new_file_id()
        writer = self.store.blobs.writer(file_id)
        check = JsonlCheck(limits.max_line_bytes, limits.max_lines)
        reader = MultipartReader(boundary)
        part, filename, purpose, size, seen_file = None, "", b"", 0, False
        try:
            more = True
            while more and not reader.finished:
                chunk, more = await self._next(receive)
                for event in reader.feed(chunk):
                    if isinstance(event, PartStart):
                        part = event.name
                        if part == "file":
                            if seen_file:
                                raise bad_request("Send one file per upload.", param="file")
                            seen_file, filename = True, event.filename or "upload.jsonl"
                    elif isinstance(event, PartEnd):
                        part = None
                    elif part == "file":
                        size += len(event.data)
                        if size > limits.max_file_bytes:
                            raise too_large(limits.max_file_bytes)
                        if used + size > limits.max_bytes:
                            raise over_quota(
                                f"This upload would bring your files to more than your quota "
                                f"of {limits.max_bytes} bytes ({used} bytes used)."
                            )
                        check.feed(event.data)
                        await writer.write(event.data)
                    elif part == "purpose":
                        purpose += event.data
                        if len(purpose) > MAX_FIELD_BYTES:
                            raise bad_request("purpose is too long.", param="purpose")
            if not reader.finished:
                raise bad_request("The multipart body ended before its closing boundary.")
            if not seen_file:
                raise bad_request("The upload has no 'file' field.", param="file")
            if purpose.decode("utf-8", "replace") != UPLOAD_PURPOSE:
                raise bad_request(
                    f"purpose must be '{UPLOAD_PURPOSE}', the only purpose this server accepts.",
                    param="purpose",
                )
            check.finish()
            endpoint = next(iter(check.urls)) if len(check.urls) == 1 else ""
            await writer.commit()
        except BaseException:
            await writer.discard()
            raise
        made = record(file_id, tenant, UPLOAD_PURPOSE, filename[:255], size, check.lines, endpoint)
        try:
            await self.store.add(made, quota=True)
        except BaseException:
            await self.store.blobs.delete(file_id)
            raise
        return made

    async def _next(self, receive: Receive) -> tuple[bytes, bool]:
        """The next chunk of the body, and whether more follow."""
        try:
            async with asyncio.timeout(self.read_timeout):
                message = await receive()
        except TimeoutError:
            raise APIError(
                408,
                f"The upload sent nothing for {self.read_timeout:g} seconds.",
                code="request_timeout",
            ) from None
        if message["type"] == "http.disconnect":
            raise bad_request("The client went away during the upload.", param="file")
        return message.get("body", b""), message.get("more_body", False)
