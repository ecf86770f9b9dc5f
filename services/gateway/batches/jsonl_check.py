"""Every line of a batch input file checked as it streams in, before the file is accepted.

A line is one request (an embeddings line, one per input): a JSON object with
a unique `custom_id`, `method` "POST", a `url` among the batch endpoints and a
`body` that endpoint accepts (its schema, as the route checks it; endpoints.py).
The first bad line ends the upload with a 400 naming its line number and
field; nothing is stored.

What this holds: the unfinished line (at most max_line_bytes, a request
body's limit) and a 16-byte digest per custom_id seen (at most max_lines),
so a 200 MB file costs a few megabytes at most.
"""

import hashlib
from dataclasses import dataclass, field

import msgspec

from maas_services.common.openai_api.errors import APIError, bad_request
from maas_services.gateway.batches.endpoints import ENDPOINTS, endpoint_for

_decode = msgspec.json.decode
# Every line's custom_id is kept while its batch runs: bounded, as OpenAI's are short.
MAX_CUSTOM_ID_CHARS = 512


def line_error(number: int, message: str, param: str) -> APIError:
    return bad_request(f"Line {number} of the file: {message}", param=param, code="invalid_jsonl")


def check_line(number: int, raw: bytes) -> tuple[str, str]:
    """(custom_id, url) of a valid request line; else line_error."""
    try:
        request = _decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        raise line_error(number, "not valid JSON.", "line") from None
    if not isinstance(request, dict):
        raise line_error(number, "must be a JSON object.", "line")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise line_error(number, "'custom_id' must be a non-empty string.", "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise line_error(
            number, f"'custom_id' is longer than {MAX_CUSTOM_ID_CHARS} characters.", "custom_id"
        )
    if request.get("method") != "POST":
        raise line_error(number, "'method' must be \"POST\".", "method")
    url = request.get("url")
    if url not in ENDPOINTS:
        raise line_error(
            number, f"'url' must be one of {', '.join(ENDPOINTS)}, not {url!r}.", "url"
        )
    body = request.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise line_error(number, "'body' must be an object naming a 'model'.", "body.model")
    try:
        endpoint_for(url).prepare(body)
    except APIError as exc:
        raise line_error(number, exc.message, exc.param or "body") from None
    return custom_id, url


@dataclass
class JsonlCheck:
    max_line_bytes: int
    max_lines: int
    # Requests, and lines read (blank ones included: errors name the file's own line numbers).
    lines: int = 0
    read: int = 0
    urls: set[str] = field(default_factory=set)
    _partial: list[bytes] = field(default_factory=list)
    _partial_bytes: int = 0
    _seen: set[bytes] = field(default_factory=set)

    def feed(self, data: bytes) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            self._take(data[start:end])
            start = end + 1
        rest = data[start:]
        if rest:
            self._partial.append(rest)
            self._partial_bytes += len(rest)
            if self._partial_bytes > self.max_line_bytes:
                raise line_error(
                    self.read + 1,
                    f"longer than {self.max_line_bytes} bytes, a request body's limit.",
                    "line",
                )

    def finish(self) -> None:
        """The file's end: its last line (if unterminated) is checked, and it has one at least."""
        self._take(b"")
        if not self.lines:
            raise bad_request("The file holds no requests.", param="file", code="invalid_jsonl")

    def _take(self, tail: bytes) -> None:
        raw = b"".join([*self._partial, tail]) if self._partial else tail
        self._partial, self._partial_bytes = [], 0
        self.read += 1
        number = self.read
        if len(raw) > self.max_line_bytes:
            raise line_error(
                number, f"longer than {self.max_line_bytes} bytes, a request body's limit.", "line"
            )
        if not raw.strip():
            return
        if self.lines + 1 > self.max_lines:
            raise line_error(number, f"a batch holds at most {self.max_lines} requests.", "line")
        custom_id, url = check_line(number, raw)
        digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
        if digest in self._seen:
            raise line_error(
                number, f"custom_id {custom_id!r} is used by an earlier line.", "custom_id"
            )
        self._seen.add(digest)
        self.urls.add(url)
        self.lines += 1
