"""The KServe v2 REST API (Open Inference Protocol, with Triton's extensions) as an ASGI
application over one front end's :class:`~trtserve.frontend.state.FrontendState`.

Routes (``{v}``: an optional ``/versions/<version>``):

=========================================  ===================================================
``GET /v2/health/live``                    200 while the process answers
``GET /v2/health/ready``                   200 when ready, else 503
``GET /v2``                                server metadata
``GET /v2/models/{m}{v}``                  model metadata
``GET /v2/models/{m}{v}/ready``            200 when ready, else 503
``GET /v2/models/{m}{v}/config``           the model config (protobuf JSON, field names as in config.pbtxt)
``GET /v2/models[/{m}{v}]/stats``          statistics (Triton's form)
``POST /v2/models/{m}{v}/infer``           inference: JSON, or the binary tensor extension
``POST /v2/repository/index``              every model with its state
``POST /v2/repository/models/{m}/load``    load or reload (``{"parameters": {"config": "<JSON>"}}``)
``POST /v2/repository/models/{m}/unload``  unload
``POST /v1/embeddings``                    OpenAI embeddings (:mod:`.openai`)
``GET /v1/models``                         the models that answer ``/v1/embeddings``
``POST /tokenize``                         a model's tokens of texts (TEI's shape, :mod:`trtserve.protocol.tokenize`)
=========================================  ===================================================

Errors are ``{"error": "<sentence>"}`` with the HTTP status of the error's class
(:data:`HTTP_STATUS`, from the one table :data:`trtserve.frontend.status.STATUS_NAMES`): 400
invalid, 404 unknown model or route, 413 a body over the limit (the connection then closes, its
body unread), 429 with ``Retry-After`` for
overload and full queues, 501 unimplemented, 503 not ready or draining, 504 deadline. A
request's deadline is its ``timeout`` parameter (µs) or the :data:`TIMEOUT_HEADER` header (µs),
the earlier of the two, and the model's default. Under ``/v1/`` errors take OpenAI's shape
(:func:`.openai.error_body`) with the same statuses.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from google.protobuf import json_format

from trtserve import __version__
from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import InvalidRequest, TrtServeError, WindowExpired
from trtserve.frontend.http.hold import TIMEOUT_HEADER
from trtserve.frontend.http.openai import PREFIX, OpenAIRoutes, error_body
from trtserve.frontend.http.protocol import CLIENT_GONE
from trtserve.frontend.inflight import GRACE_EXPIRED
from trtserve.frontend.pipeline import FrontendModel
from trtserve.frontend.state import FrontendState
from trtserve.frontend.status import status_name
from trtserve.ipc.queries import Load, ModelReady, RepositoryIndex, ServerReady, Statistics, Unload
from trtserve.protocol import rest, tokenize

EXTENSIONS = ["model_configuration", "parameters", "schedule_policy", "statistics", "binary_tensor_data"]
"""The protocol extensions server metadata lists."""
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429, "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504, "INTERNAL": 500, "UNAUTHENTICATED": 401,
}
"""HTTP status of each status name; a retryable refusal (429, 503) carries ``Retry-After: 1``."""

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
_INFER = re.compile(_MODEL + r"/infer")
_EMBEDDINGS = PREFIX + "embeddings"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"/v2/health/live"), "live"),
    ("GET", re.compile(r"/v2/health/ready"), "ready"),
    ("GET", re.compile(r"/v2/?"), "server_metadata"),
    ("GET", re.compile(r"/v2/models/stats"), "statistics"),
    ("POST", _INFER, "infer"),
    ("GET", re.compile(_MODEL + r"/ready"), "model_ready"),
    ("GET", re.compile(_MODEL + r"/config"), "model_config"),
    ("GET", re.compile(_MODEL + r"/stats"), "statistics"),
    ("GET", re.compile(_MODEL), "model_metadata"),
    ("POST", re.compile(r"/v2/repository/index"), "repository_index"),
    ("POST", re.compile(r"/v2/repository/models/(?P<model>[^/]+)/load"), "load"),
    ("POST", re.compile(r"/v2/repository/models/(?P<model>[^/]+)/unload"), "unload"),
    ("POST", re.compile(_EMBEDDINGS), "embeddings"),
    ("GET", re.compile(r"/v1/models"), "models"),
    ("POST", re.compile(r"/tokenize"), "tokenize"),
]
_OPEN = ("live", "ready")  # routes open without the token unless protect_health
_UNIMPLEMENTED = re.compile(r"/v2/(systemsharedmemory|cudasharedmemory|trace|logging)(/.*)?")
_JSON = [(b"content-type", b"application/json")]
_CLOSE = (b"connection", b"close")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before its request body was whole (fewer bytes than its
    ``Content-Length``): nothing was run and there is no one to answer."""


class HttpError(Exception):
    """An answer other than 200 that is not a trtserve error (a route or method not found, a body too large)."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


class RestApp:
    """The ASGI application of one front end's HTTP door.

    Args:
        state: the front end's served models, gate and request path.
        max_body_bytes: the largest request body; a larger one is refused 413 before it is read whole.
        auth_token: require ``authorization: Bearer <token>`` (401 otherwise) on every route but
            health, and on health too when ``auth_health``.
    """

    def __init__(self, state: FrontendState, *, max_body_bytes: int, auth_token: str | None = None,
                 auth_health: bool = False) -> None:
        self.state = state
        self.max_body_bytes = max_body_bytes
        self._token = f"Bearer {auth_token}".encode() if auth_token else None
        self._auth_health = auth_health
        self._openai = OpenAIRoutes(state, self.gated)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        try:
            name, match = self._route(scope["method"], scope["path"])
            if self._token is not None and (name not in _OPEN or self._auth_health):
                sent = headers.get(b"authorization", b"")
                if not hmac.compare_digest(sent, self._token):
                    raise HttpError(401, "missing or wrong 'authorization: Bearer <token>' header",
                                    ((b"www-authenticate", b"Bearer"),))
            body = await self._body(receive, headers)
            status, extra, payload = await getattr(self, "_" + name)(match, body, headers)
        except (TrtServeError, HttpError) as exc:
            status, extra, payload = _failure(exc, scope["path"])
        except ClientGone:
            return
        except asyncio.CancelledError as exc:
            if exc.args == (CLIENT_GONE,):  # the connection closed while its answer was pending
                return
            if not self.state.inflight.expired:
                raise
            status, extra, payload = _failure(HttpError(503, GRACE_EXPIRED), scope["path"])
        if self.state.inflight.draining and _CLOSE not in extra:  # the client reconnects (elsewhere) now
            extra = [*extra, _CLOSE]
        await send({"type": "http.response.start", "status": status,
                    "headers": [*extra, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    def holdable(self, method: str, path: str) -> bool:
        """Whether a request is an inference request (a KServe infer or an OpenAI embeddings
        request): the only ones the HTTP door's transport hold may hold
        (:mod:`trtserve.frontend.http.hold`)."""
        return method == "POST" and (path == _EMBEDDINGS or _INFER.fullmatch(path) is not None)

    async def expired(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """ASGI: answer a request whose deadline passed while the HTTP door held it, unread: 504
        (WindowExpired, in the path's API's error shape), counted DEADLINE_EXCEEDED with
        refusal reason ``window`` (an embeddings request's model is in its unread body: it is
        counted under the unknown model)."""
        path = scope["path"]
        match = _INFER.fullmatch(path)
        exc = WindowExpired("the deadline passed while the request waited for the server's concurrency window "
                            "(the server is overloaded); retry on another server or later")
        self.state.record(match["model"] if match else "", status_name(exc), 0.0, refusal=exc.refusal)
        status, extra, payload = _failure(exc, path)
        await send({"type": "http.response.start", "status": status,
                    "headers": [*extra, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    def _route(self, method: str, path: str) -> tuple[str, re.Match[str]]:
        allowed = None
        for verb, pattern, name in _ROUTES:
            match = pattern.fullmatch(path)
            if match is not None:
                if verb == method:
                    return name, match
                allowed = verb
        if allowed is not None:
            raise HttpError(405, f"{method} {path}: use {allowed}", ((b"allow", allowed.encode()),))
        if _UNIMPLEMENTED.fullmatch(path):
            raise HttpError(501, f"{path} is not implemented: trtserve has no shared-memory, trace or log-settings "
                                 f"extension (its log settings are fixed at start)")
        raise HttpError(404, f"no route {method} {path} (the KServe v2 REST routes are under /v2, the OpenAI ones "
                             f"under /v1)")

    async def _body(self, receive: Receive, headers: dict[bytes, bytes]) -> bytes:
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise HttpError(413, f"the request body is {int(declared)} bytes, more than the server's limit of "
                                 f"{self.max_body_bytes} bytes (--max-receive-bytes)", (_CLOSE,))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise HttpError(413, f"the request body is more than the server's limit of {self.max_body_bytes} "
                                     f"bytes", (_CLOSE,))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return self._decoded(b"".join(chunks), headers.get(b"content-encoding", b"identity").lower())

    def _decoded(self, body: bytes, encoding: bytes) -> bytes:
        """The body as sent before ``Content-Encoding`` (gzip and deflate, as tritonclient.http
        compresses requests), no larger than the body limit once inflated."""
        if encoding == b"identity":
            return body
        if encoding not in (b"gzip", b"deflate"):
            raise HttpError(415, f"Content-Encoding {encoding.decode('latin-1')!r} is not supported: send gzip, "
                                 f"deflate or identity")
        inflater = zlib.decompressobj(wbits=31 if encoding == b"gzip" else 15)
        try:
            plain = inflater.decompress(body, self.max_body_bytes + 1)
        except zlib.error as exc:
            raise HttpError(400, f"the body is not valid {encoding.decode()} data: {exc}") from None
        if len(plain) > self.max_body_bytes or inflater.unconsumed_tail:
            raise HttpError(413, f"the request body inflates to more than the server's limit of "
                                 f"{self.max_body_bytes} bytes")
        return plain

    # -- health and metadata ------------------------------------------------------------

    async def _live(self, match: re.Match[str], body: bytes, headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        return 200, [], b""

    async def _ready(self, match: re.Match[str], body: bytes, headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        ready = self.state.serving and await self.state.engine.query(ServerReady())
        return (200, [], b"") if ready else _error(503, "the server is not ready (loading, draining, or a model "
                                                          "asked for is not served)", retry=False)

    async def _server_metadata(self, match: re.Match[str], body: bytes,
                               headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        return _ok({"name": "trtserve", "version": __version__, "extensions": EXTENSIONS})

    async def _model_metadata(self, match: re.Match[str], body: bytes,
                              headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        spec = (await self.state.table.get(match["model"], match["version"] or "")).spec
        tensors = [[{"name": t.name, "datatype": t.datatype.name, "shape": t.shape(spec.batched)} for t in group]
                   for group in (spec.inputs, spec.outputs)]
        versions = [s.version for s in self.state.table.info(spec.name).specs]
        return _ok({"name": spec.name, "versions": versions, "platform": spec.platform,
                    "inputs": tensors[0], "outputs": tensors[1]})

    async def _model_ready(self, match: re.Match[str], body: bytes,
                           headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        name, version = match["model"], match["version"] or ""
        ready = (not self.state.inflight.draining and self.state.table.ready(name, version)
                 and await self.state.engine.query(ModelReady(name, version)))
        return (200, [], b"") if ready else _error(503, f"model '{name}' is not ready", retry=False)

    async def _model_config(self, match: re.Match[str], body: bytes,
                            headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        spec = (await self.state.table.get(match["model"], match["version"] or "")).spec
        return _ok(_numbers(json_format.MessageToDict(spec.config, preserving_proto_field_name=True)))

    async def _statistics(self, match: re.Match[str], body: bytes,
                          headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        name = match.groupdict().get("model") or ""
        data = await self.state.engine.query(Statistics(name, match.groupdict().get("version") or ""))
        return _ok(_numbers(json_format.MessageToDict(pb.ModelStatisticsResponse.FromString(data),
                                                      preserving_proto_field_name=True,
                                                      always_print_fields_with_no_presence=True)))

    async def _repository_index(self, match: re.Match[str], body: bytes,
                                headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        ready = bool(rest.json_object(body).get("ready", False)) if body else False
        index = pb.RepositoryIndexResponse.FromString(await self.state.engine.query(RepositoryIndex(ready)))
        return _ok([{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
                    for m in index.models])

    async def _load(self, match: re.Match[str], body: bytes, headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        await self.state.engine.query(Load(match["model"], _parameters(body)))
        await self.state.table.refresh()
        return 200, [], b""

    async def _unload(self, match: re.Match[str], body: bytes,
                      headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        await self.state.engine.query(Unload(match["model"], _parameters(body)))
        await self.state.table.refresh()
        return 200, [], b""

    # -- inference --------------------------------------------------------------------------

    async def _infer(self, match: re.Match[str], body: bytes, headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        """A KServe infer request, through :meth:`gated`."""

        def build(model: FrontendModel) -> tuple[pb.ModelInferRequest, rest.RestInfer]:
            parsed = _parse(body, headers, match["model"], match["version"] or "")
            return parsed.request, parsed

        response, parsed = await self.gated(headers, match["model"], match["version"] or "", build)
        payload, head = rest.infer_body(response, parsed)
        extra = list(_JSON) if head is None else [
            (b"content-type", b"application/octet-stream"), (rest.HEADER_LENGTH.encode(), str(head).encode())]
        return 200, extra, payload

    async def _embeddings(self, match: re.Match[str], body: bytes,
                          headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        return await self._openai.embeddings(body, headers)

    async def _models(self, match: re.Match[str], body: bytes, headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        return await self._openai.models(body, headers)

    async def _tokenize(self, match: re.Match[str], body: bytes,
                        headers: dict[bytes, bytes]) -> tuple[int, list, bytes]:
        """``POST /tokenize``: each text's tokens (:meth:`FrontendState.tokenize
        <trtserve.frontend.state.FrontendState.tokenize>`); the front end answers it alone."""
        model, texts, special = tokenize.parse_tokenize(rest.json_object(body))
        tokens = await self.state.tokenize(model, "", texts, special)
        return _ok(tokenize.tokens_body(tokens))

    async def gated(self, headers: dict[bytes, bytes], model: str, version: str,
                    build: Callable[[FrontendModel], tuple[pb.ModelInferRequest, T]],
                    ) -> tuple[pb.ModelInferResponse, T]:
        """One inference request of either API through the front end's in-flight gate (admitted,
        tracked for the drain, released) and request path
        (:meth:`FrontendState.answer <trtserve.frontend.state.FrontendState.answer>`).

        Args:
            headers: the request's headers (its deadline: :data:`TIMEOUT_HEADER`).
            model, version: the model asked for (version empty: the highest served); an
                unknown one is refused 404 before ``build`` runs.
            build: the request for the served model, and what the caller needs to answer it;
                a TrtServeError it raises is the answer, counted as a decoding failure is.

        Returns:
            The response, and the second item ``build`` returned.

        Raises:
            TrtServeError: the refusal (the gate's, ``build``'s or the request path's).
        """
        state = self.state
        now = state.clock.now()
        with state.inflight.held(asyncio.current_task()) as refusal:
            transport_deadline = float("inf")
            try:
                transport_deadline = _transport_deadline(headers, now)
                served = await state.table.get(model, version)  # an unknown model is 404 first
                request, built = build(served)
            except TrtServeError as exc:  # answered, and counted, as a decoding failure is
                request = pb.ModelInferRequest(model_name=model, model_version=version)
                refusal = refusal or exc
            response = await state.answer(request, transport_deadline, refusal)
        return response, built


def _parse(body: bytes, headers: dict[bytes, bytes], model: str, version: str) -> rest.RestInfer:
    length = headers.get(rest.HEADER_LENGTH.encode())
    if length is not None and not length.isdigit():
        raise InvalidRequest(f"Inference-Header-Content-Length must be a whole number of bytes (the length of the "
                             f"JSON part), got {length.decode('latin-1')!r}")
    return rest.parse_infer(body, int(length) if length is not None else None, model, version)


def _transport_deadline(headers: dict[bytes, bytes], now: float) -> float:
    value = headers.get(TIMEOUT_HEADER.encode())
    if value is None:
        return float("inf")
    if not value.isdigit():
        raise InvalidRequest(f"header {TIMEOUT_HEADER} must be a whole number of microseconds, "
                             f"got {value.decode('latin-1')!r}")
    return now + int(value) / 1e6


def _parameters(body: bytes) -> dict[str, Any]:
    params = rest.json_object(body).get("parameters", {}) if body else {}
    if not isinstance(params, dict):
        raise InvalidRequest("'parameters' must be a JSON object")
    return params


def _numbers(doc: Any, key: str = "") -> Any:
    """Protobuf JSON writes 64-bit integers as strings; Triton's REST answers give numbers
    (names, versions, states, reasons and config parameter values stay strings)."""
    if isinstance(doc, dict):
        return {k: _numbers(v, k) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_numbers(v, key) for v in doc]
    if isinstance(doc, str) and doc.isdigit() and key not in ("name", "version", "state", "reason", "string_value"):
        return int(doc)
    return doc


def _ok(doc: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return 200, list(_JSON), orjson.dumps(doc)


def _failure(exc: TrtServeError | HttpError, path: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The answer to a refusal: its status and headers, the body in the shape of the path's API."""
    if isinstance(exc, HttpError):
        status, headers = exc.status, list(exc.headers)
    else:
        status, headers = HTTP_STATUS[status_name(exc)], []
    status, extra, payload = _error(status, str(exc))
    if path.startswith(PREFIX):
        payload = error_body(status, exc)
    return status, extra + headers, payload


def _error(status: int, message: str, *, retry: bool = True) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    extra = list(_JSON)
    if retry and status in (429, 503):
        extra.append((b"retry-after", b"1"))
    return status, extra, orjson.dumps({"error": message})


__all__ = ["EXTENSIONS", "HTTP_STATUS", "TIMEOUT_HEADER", "HttpError", "RestApp"]
