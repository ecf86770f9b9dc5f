"""A streaming multipart/form-data reader: each part's bytes as they arrive, never a whole part.

`/v1/files` uploads are multipart (the `openai` SDK's files.create sends the
fields `purpose` and `file`). Starlette's parser spools a file part to a
temporary file and returns only once the whole body is in; here every part's
bytes are handed on as they come (the upload writes them to the blob store
and checks them line by line), and the most this holds at once is one
received chunk plus a delimiter's length.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from maas_services.common.openai_api.errors import bad_request

# A part's headers beyond this are not a form a client of ours sends.
MAX_PART_HEADER_BYTES = 8 * 1024


def boundary_of(content_type: str) -> bytes:
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "multipart/form-data":
        raise bad_request("The upload must be multipart/form-data.", param="file")
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "boundary" and value:
            value = value.strip('"')
            if len(value) <= 70:
                return value.encode("latin-1")
    raise bad_request("The multipart Content-Type names no valid boundary.", param="file")


@dataclass
class PartStart:
    name: str
    filename: str | None


@dataclass
class PartData:
    data: bytes


@dataclass
class PartEnd:
    pass


Event = PartStart | PartData | PartEnd


class MultipartReader:
    """Feed the body's chunks; each feed yields the events they complete."""

    def __init__(self, boundary: bytes):
        self._delimiter = b"\r\n--" + boundary
        # The body starts with the delimiter without its CRLF; pretend it had one.
        self._buffer = b"\r\n"
        self._state = "preamble"
        self.finished = False

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buffer += chunk
        while True:
            if self._state == "preamble":
                at = self._buffer.find(self._delimiter)
                if at < 0:
                    self._buffer = self._buffer[-len(self._delimiter) :]
                    return
                self._buffer = self._buffer[at + len(self._delimiter) :]
                self._state = "after_delimiter"
            elif self._state == "after_delimiter":
                if len(self._buffer) < 2:
                    return
                if self._buffer.startswith(b"--"):
                    self._state, self.finished, self._buffer = "done", True, b""
                    return
                self._state = "headers"
            elif self._state == "headers":
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_PART_HEADER_BYTES:
                        raise bad_request("A multipart part's headers are too large.")
                    return
                yield _part_start(self._buffer[:end])
                self._buffer = self._buffer[end + 4 :]
                self._state = "data"
            elif self._state == "data":
                at = self._buffer.find(self._delimiter)
                if at < 0:
                    # Keep what could be the start of a delimiter split across chunks.
                    keep = len(self._delimiter) - 1
                    if len(self._buffer) > keep:
                        yield PartData(self._buffer[:-keep])
                        self._buffer = self._buffer[-keep:]
                    return
                if at:
                    yield PartData(self._buffer[:at])
                yield PartEnd()
                self._buffer = self._buffer[at + len(self._delimiter) :]
                self._state = "after_delimiter"
            else:
                return


def _part_start(raw: bytes) -> PartStart:
    name, filename = None, None
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        header, _, value = line.partition(":")
        if header.strip().lower() != "content-disposition":
            continue
        for param in value.split(";")[1:]:
            key, _, val = param.strip().partition("=")
            val = val.strip().strip('"')
            if key.lower() == "name":
                name = val
            elif key.lower() == "filename":
                filename = val
    if name is None:
        raise bad_request("A multipart part has no Content-Disposition name.")
    return PartStart(name, filename)
