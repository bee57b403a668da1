"""The OpenAI embeddings API on the HTTP door, for the models that declare it
(:func:`trtserve.protocol.openai.embedding_io`).

Routes:

==========================  ======================================================================
``POST /v1/embeddings``     embeddings of a string or a list of strings, in order
``GET /v1/models``          the served models that answer ``/v1/embeddings``
==========================  ======================================================================

An embeddings request goes through the front end's gate and request path as a KServe infer
request does (:meth:`RestApp.gated <trtserve.frontend.http.app.RestApp.gated>`): one request of
``[n, 1]`` strings, shed, batched (more rows than ``max_batch_size`` are split by the model's
``split_oversized_requests``, on by default), counted and refused the same way. ``usage``
counts tokens with the handler's ``count_tokens`` (:mod:`trtserve.handlers`) where it has one,
else reports 0: the OpenAI clients require the field, and a count trtserve cannot know is not
made up. With ``"long_text": "chunk"`` it counts every token the model read: each window's,
[CLS] and [SEP] included, so the pieces two windows share count twice.

Every answer under ``/v1/`` that is not 200 is ``{"error": {"message", "type", "param",
"code"}}`` (:func:`error_body`) with the HTTP status the KServe routes give the same error.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.errors import ModelNotFound
from trtserve.frontend.pipeline import FrontendModel
from trtserve.frontend.state import FrontendState
from trtserve.protocol import openai, rest
from trtserve.protocol.parameters import CHUNK

PREFIX = "/v1/"
"""The paths whose errors take OpenAI's shape."""
ERROR_TYPES = {429: "rate_limit_error", 504: "timeout_error"}
"""OpenAI's error ``type`` of an HTTP status other than these: ``invalid_request_error`` below
500 (400, 401, 404, 405, 413, 415), ``server_error`` from 500 (500, 501, 503)."""
_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
Build = Callable[[FrontendModel], tuple[pb.ModelInferRequest, Any]]
Gated = Callable[[dict[bytes, bytes], str, str, Build], Awaitable[tuple[pb.ModelInferResponse, Any]]]


class OpenAIRoutes:
    """The ``/v1`` routes of one front end's HTTP door.

    Args:
        state: the front end's served models, gate and request path.
        gated: runs one request through the gate and request path
            (:meth:`RestApp.gated <trtserve.frontend.http.app.RestApp.gated>`).
    """

    def __init__(self, state: FrontendState, gated: Gated) -> None:
        self.state = state
        self.gated = gated

    async def embeddings(self, body: bytes, headers: dict[bytes, bytes]) -> Answer:
        """``POST /v1/embeddings``: the model's embedding of each input string, in order.

        Raises:
            InvalidRequest (400): not a JSON object; no ``model``
                (:func:`~trtserve.protocol.openai.model_of`).
            ModelNotFound (404): no such model, or one that does not declare the API.
            BadField (400): see :func:`~trtserve.protocol.openai.parse_embeddings`; or
                ``dimensions`` the model was not trained to give
                (:func:`~trtserve.protocol.openai.check_dimensions`).
            TrtServeError: any refusal of the request path (429, 503, 504, ...).
        """
        doc = rest.json_object(body)
        name = openai.model_of(doc)

        def build(model: FrontendModel) -> tuple[pb.ModelInferRequest, tuple[FrontendModel, str, openai.Embeddings,
                                                                             int | None]]:
            text_input, output = self._declared(model)
            asked = openai.parse_embeddings(doc)
            cut = openai.check_dimensions(model.spec, output, asked.dimensions)
            request = openai.infer_request(name, text_input, output, asked.texts, asked.long_text)
            return request, (model, output, asked, cut)

        response, (model, output, asked, cut) = await self.gated(headers, name, "", build)
        count = getattr(model.handler, "count_tokens", None)
        whole = {"whole": True} if asked.long_text == CHUNK else {}  # every window's tokens
        tokens = [0] if count is None else await asyncio.get_running_loop().run_in_executor(
            self.state.pool, functools.partial(count, asked.texts, **whole))
        return _ok(openai.embeddings_body(response, output, asked.encoding, tokens, cut))

    async def models(self, body: bytes, headers: dict[bytes, bytes]) -> Answer:
        """``GET /v1/models``: the models this front end serves that declare the embeddings API."""
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "trtserve"}
                for name in self._embedding_models()]
        return _ok({"object": "list", "data": data})

    def _embedding_models(self) -> list[str]:
        return [name for name, built in sorted(self.state.table.versions.items())
                if any(openai.embedding_io(m.spec) for m in built.values())]

    def _declared(self, model: FrontendModel) -> tuple[str, str]:
        io = openai.embedding_io(model.spec)
        if io is None:
            served = ", ".join(self._embedding_models()) or "none"
            raise ModelNotFound(f"model '{model.spec.name}' does not answer /v1/embeddings (its config.pbtxt has no "
                                f"'{openai.PARAMETER}' parameter); the models that do: {served}")
        return io


def error_body(status: int, exc: Exception) -> bytes:
    """OpenAI's error answer for ``exc`` answered ``status``: ``{"error": {"message", "type",
    "param", "code"}}`` (``param``: the body field at fault; ``code``: ``model_not_found``,
    ``invalid_api_key``, ``rate_limit_exceeded`` or null)."""
    code = "model_not_found" if isinstance(exc, ModelNotFound) else _CODES.get(status)
    return orjson.dumps({"error": {"message": str(exc), "type": _error_type(status),
                                   "param": getattr(exc, "param", None), "code": code}})


def _error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def _ok(doc: Any) -> Answer:
    return 200, [(b"content-type", b"application/json")], orjson.dumps(doc)


__all__ = ["ERROR_TYPES", "PREFIX", "OpenAIRoutes", "error_body"]
