"""The ``/v1/embeddings`` request body (``trtserve.protocol.openai.parse_embeddings``): null for
any optional field is that field left out, and token ids, in range or not, are refused naming the
range (issue 37 item 5)."""

from __future__ import annotations

import orjson
import pytest

from trtserve.protocol.openai import TOKEN_ID_RANGE, BadField, parse_embeddings

OPTIONAL = ("encoding_format", "dimensions", "user")


@pytest.mark.parametrize("field", OPTIONAL)
def test_null_for_an_optional_field_is_the_field_left_out(field):
    left_out = parse_embeddings({"model": "m", "input": "hi"})
    assert parse_embeddings({"model": "m", "input": "hi", field: None}) == left_out


@pytest.mark.parametrize("field, value", [("encoding_format", ""), ("user", 7), ("dimensions", 0)])
def test_a_present_optional_field_must_still_be_valid(field, value):
    with pytest.raises(BadField) as err:
        parse_embeddings({"model": "m", "input": "hi", field: value})
    assert err.value.param == field


def test_null_input_is_refused_as_missing():
    with pytest.raises(BadField) as err:
        parse_embeddings({"model": "m", "input": None})
    assert err.value.param == "input" and "a string or a list of strings" in str(err.value)


@pytest.mark.parametrize("body", [b"[18446744073709551616]", b"[[1, 2], [-3]]", b"[1.5]", b"[4294967296]"])
def test_a_token_id_out_of_range_is_refused_naming_the_range(body):
    doc = {"model": "m", "input": orjson.loads(body)}
    with pytest.raises(BadField) as err:
        parse_embeddings(doc)
    low, high = TOKEN_ID_RANGE
    message = str(err.value)
    assert err.value.param == "input" and "token ids are not supported, send text" in message
    assert f"token ids are integers from {low} to {high}" in message, message


def test_token_ids_in_range_are_refused_as_token_ids():
    with pytest.raises(BadField) as err:
        parse_embeddings({"model": "m", "input": [[101, 2023], [102]]})
    assert str(err.value) == "token ids are not supported, send text (a string or a list of strings)"
