"""Read a request body within a size and a time, then parse it into a request model.

Over the size -> 413, from Content-Length before a byte is read, else as
soon as a chunked upload passes it; not all sent within the time -> 408 (a
slow body must not hold a connection and its buffer for ever); too many JSON
items for its size -> 400 before it is decoded (the gateway's body_shape);
then the model's own validation -> 400 naming the first bad field.
"""

import asyncio
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from maas_services.common.openai_api.body_shape import check_shape
from maas_services.common.openai_api.errors import APIError, bad_request

M = TypeVar("M", bound=BaseModel)


def too_large(max_bytes: int) -> APIError:
    return APIError(
        413, f"The request body is larger than {max_bytes} bytes.", code="request_too_large"
    )


async def read_body(request: Request, max_bytes: int, timeout: float) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(max_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(
            408, f"The request body was not sent within {timeout:g} s.", code="request_timeout"
        ) from None
    return b"".join(chunks)


def parse_body(model: type[M], body: bytes) -> M:
    check_shape(body)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise bad_request("We could not parse the JSON body of your request.") from None
        # The top-level field: deeper, union members put type names in the path.
        param = str(first["loc"][0]) if first["loc"] else None
        raise bad_request(f"Invalid value for '{param}': {first['msg']}", param=param) from None
