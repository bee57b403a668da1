"""The queue door's wire format: the Redis keys, a request message's fields, and a result's.

Pure: no Redis here. One stream per model; each entry is one request (the fields below). Field
names and values are bytes on the wire; numbers are decimal ASCII. The guide
(``docs/guide/queue.md``) has the same tables for producers in any language.

Request fields (an entry of ``{prefix}:requests:{model}``):

==============  ========  ===================================================================
field           required  meaning
==============  ========  ===================================================================
body            yes       the request: KServe v2 JSON (with ``header_length``: the binary
                          tensor extension) or a serialized ``inference.ModelInferRequest``
format          no        ``json`` (default) or ``proto``: how ``body`` is written
header_length   no        json only: bytes of JSON at the start of ``body``; binary tensors follow
id              no        the request id (default: the entry id); one result per model and id
model           no        the model; when given it must be the stream's
version         no        the model version (default: the highest served)
priority        no        1 is the most urgent (default: the model's default level)
timeout_us      no        microseconds from the time Redis assigned the entry id
reply_to        no        a stream key the result is also appended to
result_ttl_s    no        seconds the result key lives (default: ``--redis-result-ttl``)
==============  ========  ===================================================================

A message that breaks these rules (or whose body does not parse) is dead-lettered at once
(:class:`Garbage`).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import InvalidRequest
from trtserve.protocol import rest

GROUP = "trtserve"
"""The consumer group every trtserve reads the request streams with."""
FIELDS = frozenset((b"body", b"format", b"header_length", b"id", b"model", b"version", b"priority", b"timeout_us",
                    b"reply_to", b"result_ttl_s"))
"""The request fields the door reads; any other is refused (nothing accepted and ignored)."""
FORMATS = ("json", "proto")


def stream_key(prefix: str, model: str) -> str:
    """The request stream of ``model``."""
    return f"{prefix}:requests:{model}"


def dead_key(prefix: str, model: str) -> str:
    """The dead-letter stream of ``model``: the request's fields, plus ``reason``, ``deliveries``,
    ``entry`` (its id in the request stream)."""
    return f"{prefix}:dead:{model}"


def result_key(prefix: str, model: str, request_id: str) -> str:
    """The result hash of request ``request_id`` of ``model`` (fields: :func:`result_fields`)."""
    return f"{prefix}:result:{model}:{request_id}"


def entry_ms(entry_id: bytes | str) -> int:
    """The milliseconds (Redis's clock, Unix epoch) in a stream entry id ``<ms>-<seq>``."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


class Garbage(InvalidRequest):
    """A message the door cannot read as a request: dead-lettered at once with this reason (and,
    when its id was readable, answered INVALID_ARGUMENT in its result key)."""


@dataclass(frozen=True)
class QueueRequest:
    """One request message, read.

    Attributes:
        id: the request id (the ``id`` field, else the entry id).
        request: the ``ModelInferRequest`` (``priority`` and ``timeout`` set as parameters from
            the message's fields, the timeout counting from the entry id's time).
        rest: the JSON form's output choices (binary or JSON outputs), or None for ``proto``.
        reply_to: the reply stream, or None.
        ttl_ms: how long the result key lives (milliseconds).
    """

    id: str
    request: pb.ModelInferRequest
    rest: rest.RestInfer | None
    reply_to: str | None
    ttl_ms: int


def request_id(fields: dict[bytes, bytes], entry_id: bytes) -> str:
    """The request id of a message (its ``id`` field, else the entry id)."""
    raw = fields.get(b"id") or entry_id
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return entry_id.decode()


def parse(model: str, entry_id: bytes, fields: dict[bytes, bytes], default_ttl_s: float) -> QueueRequest:
    """Read one entry of ``model``'s request stream (fields: the module docstring's table).

    Raises:
        Garbage: an unknown field, a missing body, a value of the wrong kind, another model's
            name, or a body that does not parse (the message says which).
    """
    unknown = sorted(k.decode(errors="replace") for k in fields if k not in FIELDS)
    if unknown:
        raise Garbage(f"unknown field(s) {', '.join(unknown)} (a request message has {_names()})")
    rid = request_id(fields, entry_id)
    text = {k: _text(fields, k) for k in (b"format", b"model", b"version", b"reply_to")}
    named = text[b"model"]
    if named and named != model:
        raise Garbage(f"the message names model '{named}' but came on the stream of model '{model}'")
    body = fields.get(b"body")
    if not body:
        raise Garbage("the message has no 'body' (the request, as KServe v2 JSON or a serialized ModelInferRequest)")
    form = text[b"format"] or "json"
    if form not in FORMATS:
        raise Garbage(f"'format' is '{form}'; expected json or proto")
    version = text[b"version"]
    header_length = _integer(fields, b"header_length", 1)
    if form == "json":
        try:
            parsed = rest.parse_infer(body, header_length, model, version)
        except InvalidRequest as exc:
            raise Garbage(str(exc)) from None
        request, choices = parsed.request, parsed
    else:
        if header_length is not None:
            raise Garbage("'header_length' is for the json format only")
        try:
            request = pb.ModelInferRequest.FromString(body)
        except DecodeError as exc:
            raise Garbage(f"the body is not a serialized ModelInferRequest: {exc}") from None
        if request.model_name and request.model_name != model:
            raise Garbage(f"the body names model '{request.model_name}' but came on the stream of model '{model}'")
        request.model_name = model
        request.model_version = request.model_version or version
        choices = None
    request.id = rid
    for name, key, least in (("priority", b"priority", 1), ("timeout", b"timeout_us", 1)):
        value = _integer(fields, key, least)
        if value is None:
            continue
        if name in request.parameters:
            raise Garbage(f"'{key.decode()}' is given both as a message field and as the body's '{name}' parameter")
        request.parameters[name].int64_param = value
    ttl = fields.get(b"result_ttl_s")
    try:
        ttl_s = default_ttl_s if ttl is None else float(ttl)
    except ValueError:
        ttl_s = -1.0
    if not ttl_s > 0:
        raise Garbage(f"'result_ttl_s' must be a number of seconds > 0, got {ttl!r}")
    return QueueRequest(rid, request, choices, text[b"reply_to"] or None, max(1, round(ttl_s * 1e3)))


def result_fields(
    req_id: str, model: str, version: str, status: str, message: str, *, body: bytes = b"",
    header_length: int | None = None, form: str = "json", timings: dict[str, float] | None = None,
) -> dict[str, bytes]:
    """A result, as written to its key and to the reply stream.

    Fields: ``id``; ``model``; ``version`` (the version that answered, empty when none did);
    ``status`` (``OK`` or the gRPC status name the other doors answer with); ``message`` (the
    error's sentence, empty for OK); ``format`` (as the request's); ``body`` (OK only: the
    response as KServe v2 JSON, or a serialized ``ModelInferResponse``); ``header_length`` (json
    with binary outputs: bytes of JSON at the start of ``body``); and the timings in milliseconds
    on Redis's clock: ``enqueued_ms`` (the entry id's time), ``queue_ms`` (until the door read
    it), ``total_ms`` (until the answer was written).
    """
    out = {"id": req_id, "model": model, "version": version, "status": status, "message": message,
           "format": form}
    if header_length is not None:
        out["header_length"] = str(header_length)
    for name, value in (timings or {}).items():
        out[name] = f"{value:.3f}"
    fields = {k: v.encode() for k, v in out.items()}
    if body:
        fields["body"] = body
    return fields


def _names() -> str:
    return ", ".join(sorted(f.decode() for f in FIELDS))


def _text(fields: dict[bytes, bytes], key: bytes) -> str:
    raw = fields.get(key, b"")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise Garbage(f"'{key.decode()}' is not UTF-8 text") from None


def _integer(fields: dict[bytes, bytes], key: bytes, least: int) -> int | None:
    raw = fields.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        raise Garbage(f"'{key.decode()}' must be a whole number >= {least}, got {raw!r}")
    return value


__all__ = ["FIELDS", "FORMATS", "GROUP", "Garbage", "QueueRequest", "dead_key", "entry_ms", "parse",
           "request_id", "result_fields", "result_key", "stream_key"]
