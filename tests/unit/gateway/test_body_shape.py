import json

import pytest

from maas_services.common.openai_api.body_shape import MAX_ITEMS, check_shape, json_items
from maas_services.common.openai_api.errors import APIError


def many(item: bytes, count: int) -> bytes:
    return b'{"model":"m","prompt":[' + b",".join([item] * count) + b"]}"


def test_items_are_counted_outside_strings_only():
    # Over the limit in raw characters, within it once strings are left out.
    commas = "," * (MAX_ITEMS + 10)
    body = json.dumps({"model": "m", "prompt": f'a \\" [{{{commas}', "stop": ["x,", "\\"]})
    # The object and its two commas, the stop list and its comma.
    assert json_items(body.encode()) == 5


def test_an_escaped_backslash_before_a_quote_ends_the_string():
    # The JSON string "\\" is one backslash; read as an escaped quote, every item after it would
    # look like part of the string.
    body = b'["\\\\",' + b",".join([b"1"] * (MAX_ITEMS + 10)) + b"]"
    assert json.loads(body)[0] == "\\"
    assert json_items(body) > MAX_ITEMS


@pytest.mark.parametrize("item", [b"[]", b"{}", b"1", b'"ab"'])
def test_a_body_of_many_small_items_is_refused_with_an_openai_error(item):
    with pytest.raises(APIError) as caught:
        check_shape(many(item, MAX_ITEMS))
    assert caught.value.status == 400
    assert caught.value.body()["error"]["code"] == "body_too_complex"


def test_the_largest_token_id_prompt_passes():
    check_shape(many(b"49151", 131_072))
