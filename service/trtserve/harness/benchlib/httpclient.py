"""The bench's HTTP door client: KServe v2 REST ``POST /v2/models/<model>/infer`` over aiohttp
keep-alive connections, the request bodies built before any clock starts.

A body is what ``tritonclient.http`` sends by default (its own ``generate_request_body``):
every input in Triton's binary tensor extension (the JSON header, then the raw tensor bytes,
the header's length in ``Inference-Header-Content-Length``) and, since no output is named,
``"binary_data_output": true``, so the answer's tensors come back raw too. Answers are read
to their end but not parsed: only their status is kept, as for the gRPC unary calls.

HTTP/1.1 carries one request at a time on a connection (aiohttp does not pipeline), so a
closed loop of ``c`` callers holds ``c`` connections, as ``tritonclient.http`` with
``concurrency=c`` would; each is kept alive from one call to the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import tritonclient.http as triton_http
from tritonclient.utils import np_to_triton_dtype

if TYPE_CHECKING:
    from typing_extensions import Self

    from trtserve.datatypes import Tensors

HEADER_LENGTH = "Inference-Header-Content-Length"
"""The binary extension's request header: the JSON part's length in bytes."""
TIMEOUT_CODE = "TIMEOUT"
"""The status recorded for a call the client gave up on (its ``timeout_s`` ran out)."""


@dataclass(frozen=True)
class RestRequest:
    """One serialized REST infer request.

    Attributes:
        path: ``/v2/models/<model>/infer``.
        body: the JSON header followed by the raw input tensors.
        headers: ``Inference-Header-Content-Length`` (the JSON header's bytes).
    """

    path: str
    body: bytes
    headers: Mapping[str, str]


def rest_request(model: str, inputs: Tensors, *, binary: bool = True, timeout_us: int | None = None) -> RestRequest:
    """``inputs`` (name → array, any KServe datatype; object arrays of bytes are BYTES) as the
    request ``tritonclient.http`` would send for ``model``: binary inputs (with ``binary``
    False, JSON ``data`` instead: the body is then JSON alone and needs no header), binary
    outputs; with ``timeout_us``, the ``timeout`` parameter (µs)."""
    tensors = []
    for name, array in inputs.items():
        tensor = triton_http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        tensors.append(tensor)
    body, json_size = triton_http.InferenceServerClient.generate_request_body(tensors, timeout=timeout_us)
    headers = {} if json_size is None else {HEADER_LENGTH: str(json_size)}
    return RestRequest(f"/v2/models/{model}/infer", body, headers)


def status_name(status: int) -> str:
    """A response's status as the bench's error tables name it: ``OK`` for 200, else ``HTTP <status>``."""
    return "OK" if status == 200 else f"HTTP {status}"


class RestClient:
    """``async with RestClient("127.0.0.1:8000", connections=64) as rest:`` — REST infer calls
    over one aiohttp session that keeps up to ``connections`` connections alive (callers beyond
    that wait in the session for a free one).

    Args:
        url: ``HOST:PORT`` of the server's HTTP door.
        connections: most connections open at once.
    """

    def __init__(self, url: str, connections: int) -> None:
        if connections < 1:
            raise ValueError(f"expected at least one connection, got {connections}")
        self.url = url
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def __aenter__(self) -> Self:
        connector = aiohttp.TCPConnector(limit=self.connections, limit_per_host=self.connections)
        # No automatic decompression and no cookie jar: nothing per call beyond the exchange itself.
        self._session = aiohttp.ClientSession(
            f"http://{self.url}", connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def infer(self, request: RestRequest, timeout_s: float) -> str:
        """Send ``request`` and read its answer; its status name (:func:`status_name`),
        :data:`TIMEOUT_CODE` after ``timeout_s`` seconds, or the name of the connection
        error (``ServerDisconnectedError``, ...)."""
        assert self._session is not None, "use RestClient in 'async with'"
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            timeout = self._timeouts[timeout_s] = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._session.post(request.path, data=request.body, headers=request.headers,
                                          timeout=timeout) as response:
                await response.read()
                return status_name(response.status)
        except asyncio.TimeoutError:
            return TIMEOUT_CODE
        except aiohttp.ClientError as exc:
            return type(exc).__name__
