"""Bound a JSON body's shape before it is decoded.

json.loads turns every `[]` (3 bytes) into a list object of 56 bytes plus a
pointer: a 4 MiB body of empty lists costs 95 MB decoded, a body of `{}` more,
before any schema sees it. So the body's items, counted on the raw bytes,
must stay under a limit first: an item is an array, an object, or an element
or member after the first (counted as the `[`, `{` and `,` outside strings).

Counting costs a few milliseconds at 4 MiB and at most ~3x the body: the count
over the whole body is an upper bound, and nearly every body passes on it
alone; otherwise numpy finds which of those characters are outside strings
(quote parity, once escapes are removed). A regex cutting out the strings was
measured slower and, with many strings, at 20-35x the body.
"""

import numpy as np

from maas_services.common.openai_api.errors import bad_request

# The largest token-id prompt (schemas.MAX_PROMPT_IDS) and the rest of a
# request around it. Decoded, the costliest items (small objects of strings,
# ~150 bytes an item) then stay near 21 MB, 5x a 4 MiB body.
MAX_ITEMS = 2**17 + 2**13
_STRUCTURE = b",[{"
_QUOTE = ord('"')


def json_items(body: bytes) -> int:
    """Arrays, objects and elements after the first, outside strings; or, when
    that is within MAX_ITEMS, possibly the count with those inside strings too."""
    upper = sum(body.count(bytes([char])) for char in _STRUCTURE)
    if upper <= MAX_ITEMS:
        return upper
    # Escaped backslashes first, so that what is left of `\"` is an escaped quote.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    chars = np.frombuffer(unescaped, np.uint8)
    in_string = np.cumsum(chars == _QUOTE, dtype=np.uint8)
    in_string &= 1
    outside = in_string == 0
    del in_string
    return sum(int(np.count_nonzero(outside & (chars == char))) for char in _STRUCTURE)


def check_shape(body: bytes) -> None:
    if json_items(body) > MAX_ITEMS:
        raise bad_request(
            f"The JSON body has more than {MAX_ITEMS} arrays, objects and elements.",
            code="body_too_complex",
        )
