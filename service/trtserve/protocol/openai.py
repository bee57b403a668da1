"""The OpenAI embeddings API as the gRPC ``ModelInferRequest`` / ``ModelInferResponse`` it
stands for, and a model's declaration that it answers that API.

A model declares it in its config.pbtxt (:data:`PARAMETER`)::

    parameters { key: "openai_embeddings" value: { string_value: "TEXT:EMBEDDING" } }

naming its text input (BYTES, dims ``[1]``: one string per row) and its embedding output (FP32,
one fixed dim: the embedding's length). The request body ``{"model", "input": str | [str],
"encoding_format"?: "float" | "base64", "dimensions"?, "user"?, "long_text"?}`` becomes one
request of shape ``[n, 1]`` BYTES, a row per string in order; the answer's rows become
``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
"usage"}``, each embedding a list of numbers or (``base64``) the base64 of its little-endian
float32 bytes. Nothing in the body is accepted and ignored but ``user``, an opaque string the
caller may send for its own tracing. ``null`` for an optional field (``encoding_format``,
``dimensions``, ``user``, ``long_text``) is the field left out, as the OpenAI clients send it.

``long_text`` is trtserve's own field (the OpenAI clients send it as ``extra_body``): the
request's ``long_text`` parameter (:mod:`trtserve.protocol.parameters`), ``"truncate"`` by
default, ``"chunk"`` to embed each long text whole.

``dimensions`` shorter than the model's embedding is honoured only for a model trained to give
shortened embeddings (Matryoshka representation learning), which declares the lengths it was
trained for (:data:`DIMENSIONS_PARAMETER`)::

    parameters { key: "matryoshka_dimensions" value: { string_value: "64,128,256" } }

Each embedding is then cut to its first ``dimensions`` numbers and L2-normalised again
(:func:`shorten`). Any other length, or any length short of the full one for a model that
declares none, is refused with a sentence naming the lengths it gives.
"""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

import numpy as np

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import InvalidRequest
from trtserve.protocol.codec import encode_bytes
from trtserve.protocol.parameters import LONG_TEXT, TRUNCATE
from trtserve.spec import ModelSpec

PARAMETER = "openai_embeddings"
"""The config.pbtxt ``parameters`` key: ``"<text input>:<embedding output>"``."""
DIMENSIONS_PARAMETER = "matryoshka_dimensions"
"""The config.pbtxt ``parameters`` key: the shortened lengths the model was trained to give,
comma-separated (``"64,128,256"``); ``dimensions`` may ask for one of them."""
FORMATS = ("float", "base64")
_F32 = np.dtype("<f4")  # FP32 on the wire: little-endian
_FIELDS = ("model", "input", "encoding_format", "dimensions", "user", "long_text")
_OPTIONAL = ("encoding_format", "dimensions", "user", "long_text")
TOKEN_ID_RANGE = (0, 2**32 - 1)
"""The integers a token id can be (a tokenizer's vocabulary index, unsigned 32-bit as TEI reads
them): named in the refusal of token ids, which trtserve does not take."""


class BadField(InvalidRequest):
    """An invalid body field (HTTP 400); ``param`` names it, as OpenAI's error ``param`` does."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def embedding_io(spec: ModelSpec) -> tuple[str, str] | None:
    """The (text input, embedding output) names a model declares in :data:`PARAMETER`, or
    ``None`` when it declares none.

    Raises:
        ValueError: the value is not ``"<input>:<output>"``, a tensor it names does not exist,
            the input is not BYTES with dims ``[1]``, the output not FP32 with one fixed dim,
            the model does not batch (``max_batch_size`` 0), or another input is required;
            :data:`DIMENSIONS_PARAMETER` without this parameter, or not as
            :func:`dimensions_of` reads it.
    """
    value = spec.parameters.get(PARAMETER)
    if value is None:
        if DIMENSIONS_PARAMETER in spec.parameters:
            raise ValueError(f"parameters {DIMENSIONS_PARAMETER} is read only by the OpenAI embeddings API, which "
                             f"the model does not declare (parameters {PARAMETER})")
        return None
    where = f"parameters {PARAMETER} '{value}'"
    name_in, sep, name_out = value.partition(":")
    if not sep or not name_in or not name_out:
        raise ValueError(f"{where} must be '<text input>:<embedding output>', e.g. 'TEXT:EMBEDDING'")
    inputs = {t.name: t for t in spec.inputs}
    outputs = {t.name: t for t in spec.outputs}
    if name_in not in inputs:
        raise ValueError(f"{where}: the model has no input '{name_in}' (its inputs: {', '.join(inputs)})")
    if name_out not in outputs:
        raise ValueError(f"{where}: the model has no output '{name_out}' (its outputs: {', '.join(outputs)})")
    text, embedding = inputs[name_in], outputs[name_out]
    if text.datatype.name != "BYTES" or text.dims != (1,):
        raise ValueError(f"{where}: input '{name_in}' must be TYPE_STRING with dims [ 1 ] (one string per row), "
                         f"it is {text.datatype.name} {list(text.dims)}")
    if embedding.datatype.name != "FP32" or len(embedding.dims) != 1 or embedding.dims[0] < 1:
        raise ValueError(f"{where}: output '{name_out}' must be TYPE_FP32 with one fixed dim (the embedding's "
                         f"length), it is {embedding.datatype.name} {list(embedding.dims)}")
    if not spec.batched:
        raise ValueError(f"{where}: the model must batch (max_batch_size >= 1): each string is one row")
    required = [t.name for t in spec.inputs if t.name != name_in and not t.optional]
    if required:
        raise ValueError(f"{where}: the model also requires input(s) {', '.join(required)}, which an "
                         f"embeddings request cannot send")
    dimensions_of(spec, name_out)
    return name_in, name_out


def dimension(spec: ModelSpec, output: str) -> int:
    """The length of each embedding ``output`` gives (its one dim, fixed by :func:`embedding_io`)."""
    return next(t for t in spec.outputs if t.name == output).dims[0]


def dimensions_of(spec: ModelSpec, output: str) -> tuple[int, ...]:
    """The embedding lengths ``dimensions`` may ask of the model, ascending: those it declares
    in :data:`DIMENSIONS_PARAMETER`, then its full length.

    Raises:
        ValueError: the parameter is not a comma-separated list of whole numbers from 1 to
            less than the full length.
    """
    full = dimension(spec, output)
    value = spec.parameters.get(DIMENSIONS_PARAMETER)
    if value is None:
        return (full,)
    try:
        shorter = sorted({int(v) for v in value.split(",")})
    except ValueError:
        shorter = []
    if not shorter or not all(1 <= d < full for d in shorter):
        raise ValueError(f"parameters {DIMENSIONS_PARAMETER} '{value}' must list the shortened embedding lengths "
                         f"the model was trained for, comma-separated whole numbers from 1 to {full - 1}")
    return (*shorter, full)


def check_dimensions(spec: ModelSpec, output: str, dimensions: int | None) -> int | None:
    """The length to cut each embedding to, or None to leave it whole.

    Raises:
        BadField (HTTP 400): a length the model was not trained to give (the sentence names
            those it gives).
    """
    allowed = dimensions_of(spec, output)
    if dimensions is None or dimensions == allowed[-1]:
        return None
    if dimensions not in allowed:
        if len(allowed) == 1:
            raise BadField("dimensions", f"model '{spec.name}' gives embeddings of {allowed[-1]} dimensions, not "
                                         f"{dimensions}, and was not trained to give shortened ones (its config has "
                                         f"no '{DIMENSIONS_PARAMETER}' parameter): send dimensions {allowed[-1]} or "
                                         f"none")
        raise BadField("dimensions", f"model '{spec.name}' gives embeddings of {', '.join(map(str, allowed))} "
                                     f"dimensions, not {dimensions}: its config's '{DIMENSIONS_PARAMETER}' lists "
                                     f"the shortened lengths it was trained for")
    return dimensions


def shorten(rows: np.ndarray, dimensions: int) -> np.ndarray:
    """Each row's first ``dimensions`` numbers, L2-normalised again (FP32 [n, dimensions])."""
    cut = rows[:, :dimensions].astype(np.float64)
    return (cut / np.linalg.norm(cut, axis=1, keepdims=True)).astype(np.float32)


def model_of(doc: dict[str, Any]) -> str:
    """The model a request body asks for.

    Raises:
        BadField (HTTP 400): no ``model``, or not a string.
    """
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise BadField("model", "'model' must be the name of a served model")
    return model


class Embeddings(NamedTuple):
    """What an embeddings request body asks for."""

    texts: list[str]
    encoding: str
    """``"float"`` or ``"base64"``."""
    dimensions: int | None
    """The embedding length asked for, or None."""
    long_text: str = TRUNCATE
    """The ``long_text`` parameter: ``"truncate"`` or ``"chunk"``."""


def parse_embeddings(doc: dict[str, Any]) -> Embeddings:
    """What a request body asks for.

    Raises:
        BadField (HTTP 400): an unknown field; ``input`` missing, empty, an empty string,
            token ids (numbers: the message names :data:`TOKEN_ID_RANGE`), or not a string or
            list of strings; ``encoding_format`` other than float or base64; ``dimensions`` not
            a positive integer; ``user`` not a string; ``long_text`` other than
            :data:`~trtserve.protocol.parameters.LONG_TEXT`. An optional field sent as null is
            absent.
    """
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise BadField(unknown[0], f"unknown field(s) {', '.join(unknown)}: trtserve reads {', '.join(_FIELDS)}")
    doc = {k: v for k, v in doc.items() if v is not None or k not in _OPTIONAL}
    texts = _texts(doc.get("input"))
    encoding = doc.get("encoding_format", "float")
    if encoding not in FORMATS:
        raise BadField("encoding_format", f"encoding_format must be 'float' or 'base64', got {encoding!r}")
    dimensions = doc.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise BadField("dimensions", f"dimensions must be a positive integer, got {dimensions!r}")
    if not isinstance(doc.get("user", ""), str):
        raise BadField("user", "user must be a string")
    long_text = doc.get("long_text", TRUNCATE)
    if long_text not in LONG_TEXT:
        raise BadField("long_text", f"long_text must be {' or '.join(map(repr, LONG_TEXT))}, got {long_text!r}")
    return Embeddings(texts, encoding, dimensions, long_text)


def _texts(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if isinstance(items, list) and items and all(_token_ids(v) for v in items):
        low, high = TOKEN_ID_RANGE
        flat = [n for v in items for n in (v if isinstance(v, list) else [v])]
        bad = next((n for n in flat if not (isinstance(n, int) and low <= n <= high)), None)
        also = "" if bad is None else f"; {bad!r} is not a token id either: token ids are integers from {low} to {high}"
        raise BadField("input", f"token ids are not supported, send text (a string or a list of strings){also}")
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise BadField("input", "input must be a string or a list of strings")
    if not items:
        raise BadField("input", "input is an empty list: send at least one string")
    empty = next((i for i, v in enumerate(items) if not v), None)
    if empty is not None:
        raise BadField("input", f"input[{empty}] is an empty string: each input must have text")
    return items


def _token_ids(value: Any) -> bool:
    """A number, or a list of numbers (one tokenized input, its ids in range or not: JSON
    integers past 64 bits are read as floats)."""
    if isinstance(value, list):
        return all(_number(v) for v in value)
    return _number(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def infer_request(model: str, text_input: str, output: str, texts: list[str],
                  long_text: str = TRUNCATE) -> pb.ModelInferRequest:
    """The request of ``texts`` to ``model``'s highest version: input ``text_input`` of shape
    ``[len(texts), 1]`` BYTES (UTF-8), asking for ``output`` only, with the ``long_text``
    parameter when it is not the default."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=text_input, datatype="BYTES", shape=[len(texts), 1])
    request.outputs.add(name=output)
    request.raw_input_contents.append(encode_bytes(texts))
    if long_text != TRUNCATE:
        request.parameters["long_text"].string_param = long_text
    return request


def embeddings_body(response: pb.ModelInferResponse, output: str, encoding: str,
                    tokens: list[int], dimensions: int | None = None) -> dict[str, Any]:
    """The embeddings answer of ``response`` (its ``output``, FP32 ``[n, dim]``), each row
    ``encoding`` ("float" or "base64") and cut to ``dimensions`` (:func:`shorten`) unless None;
    ``tokens`` the token count of each input, for ``usage``."""
    index = [o.name for o in response.outputs].index(output)
    shape = tuple(response.outputs[index].shape)
    rows = np.frombuffer(response.raw_output_contents[index], _F32).reshape(shape)
    if dimensions is not None:
        rows = shorten(rows, dimensions).astype(_F32)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(row.tobytes()).decode() if encoding == "base64" else row.tolist()}
            for i, row in enumerate(rows)]
    total = sum(tokens)
    return {"object": "list", "data": data, "model": response.model_name,
            "usage": {"prompt_tokens": total, "total_tokens": total}}


__all__ = ["DIMENSIONS_PARAMETER", "FORMATS", "PARAMETER", "TOKEN_ID_RANGE", "BadField", "Embeddings",
           "check_dimensions", "dimension", "dimensions_of", "embedding_io", "embeddings_body", "infer_request",
           "model_of", "parse_embeddings", "shorten"]
