"""Python client for trtserve (or any KServe v2 / Triton gRPC server): numpy in, numpy out.

Example::

    from trtserve.client import Client

    with Client("127.0.0.1:8001") as client:
        out = client.infer("tiny", {"INPUT": np.ones((2, 64), np.float32)}, timeout=1.0)
        items = ({"TEXT": np.array([[t.encode()]], object)} for t in texts)
        for request_id, result in client.stream_infer("minilm", items):
            ...

Errors come back as :class:`grpc.RpcError` (unary) or as :class:`InferError` items of the
stream, carrying the gRPC status name the server reported.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve._proto.inference import grpc_service_pb2_grpc as pb_grpc
from trtserve.datatypes import DATATYPES, from_numpy
from trtserve.protocol.codec import decode_raw, encode_tensor

MAX_MESSAGE_BYTES = 2**31 - 1
"""The largest message the client sends or accepts: gRPC's own ceiling (the server sets its limit)."""
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@dataclass(frozen=True)
class InferError:
    """A stream message that failed: its request id, gRPC status name and message."""

    id: str
    code: str
    message: str


def build_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    *,
    request_id: str = "",
    outputs: Iterable[str] = (),
    timeout_us: int | None = None,
    priority: int | None = None,
    long_text: str | None = None,
) -> pb.ModelInferRequest:
    """A ``ModelInferRequest`` with every input as raw bytes.

    Args:
        inputs: name → array (batch on axis 0 for a batched model). ``str``/``bytes``/object
            arrays are sent as BYTES, ``ml_dtypes.bfloat16`` as BF16.
        outputs: output names to return (all if empty).
        timeout_us: the request's own deadline in microseconds (``timeout`` parameter).
        priority: 1 is the most urgent (``priority`` parameter).
        long_text: ``"chunk"`` embeds each long text whole, ``"truncate"`` cuts it at the
            model's window (``long_text`` parameter; None: the server's default, truncate).

    Raises:
        KeyError: an array dtype with no KServe datatype.
    """
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, value in inputs.items():
        arr = np.asarray(value)
        datatype = from_numpy(arr.dtype)
        request.inputs.add(name=name, datatype=datatype.name, shape=arr.shape)
        request.raw_input_contents.append(encode_tensor(arr, datatype))
    for name in outputs:
        request.outputs.add(name=name)
    if timeout_us is not None:
        request.parameters["timeout"].int64_param = timeout_us
    if priority is not None:
        request.parameters["priority"].uint64_param = priority
    if long_text is not None:
        request.parameters["long_text"].string_param = long_text
    return request


def parse_response(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Output name → array from a response's ``raw_output_contents`` (BYTES as object arrays)."""
    result = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        datatype = DATATYPES[tensor.datatype]
        result[tensor.name] = decode_raw(tensor.name, raw, datatype, list(tensor.shape))
    return result


AUTH_TOKEN_ENV = "TRTSERVE_AUTH_TOKEN"
"""Environment variable with the bearer token, read by ``trtserve serve`` and ``trtserve bulk``
when no ``--auth-token-file`` is given."""


def read_token_file(path: Path | str) -> str:
    """The bearer token in a token file: its first line, surrounding whitespace stripped (the
    format ``trtserve serve --auth-token-file`` and every client read).

    Raises:
        OSError: the file cannot be read.
        ValueError: its first line is empty.
    """
    lines = Path(path).read_text().splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


@dataclass(frozen=True)
class Credentials:
    """How to reach a server started with TLS and/or a bearer token (all optional).

    Attributes:
        root_certificates: PEM of the CA that signed the server's certificate; any TLS
            field set means TLS (a server started with ``--tls-cert``).
        private_key, certificate_chain: PEM of this client's key and certificate, for a server
            that requires client certificates (``--tls-ca``, mutual TLS).
        token: sent as ``authorization: Bearer <token>`` metadata on every call (a server
            started with ``--auth-token-file``; without it such a server answers UNAUTHENTICATED).
    """

    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and (not self.token or not self.token.isascii() or not self.token.isprintable()
                                       or any(c.isspace() for c in self.token)):
            raise ValueError("the bearer token must be non-empty printable ASCII without spaces "
                             "(it travels as an HTTP/2 header value)")

    @classmethod
    def from_files(cls, ca: Path | str | None = None, cert: Path | str | None = None, key: Path | str | None = None,
                   token_file: Path | str | None = None) -> Credentials:
        """Read PEM files, and the bearer token from the first line of ``token_file`` (surrounding
        whitespace stripped); None for any not given.

        Raises:
            OSError: a file cannot be read.
            ValueError: the token file's first line is empty, or not a valid token.
        """
        token = read_token_file(token_file) if token_file is not None else None
        pems = (Path(p).read_bytes() if p is not None else None for p in (ca, key, cert))
        return cls(*pems, token=token)

    @property
    def tls(self) -> bool:
        """Whether to connect with TLS."""
        return any((self.root_certificates, self.private_key, self.certificate_chain))

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """``grpc.ssl_channel_credentials`` for a TLS server; None for plaintext."""
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata: the ``authorization`` header when there is a token."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


class Client:
    """A blocking client over one gRPC channel (thread-safe; reuse it).

    Args:
        url: ``host:port`` of the server.
        channel_options: extra gRPC channel options.
        credentials: TLS and/or token (:class:`Credentials`); None: plaintext, no token.
    """

    def __init__(self, url: str, channel_options: list[tuple[str, object]] | None = None, *,
                 credentials: Credentials | None = None) -> None:
        options = CHANNEL_OPTIONS + list(channel_options or [])
        credentials = credentials or Credentials()
        tls = credentials.channel_credentials()
        self.channel = (
            grpc.secure_channel(url, tls, options=options) if tls else grpc.insecure_channel(url, options=options)
        )
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.metadata = credentials.metadata

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel; calls in progress are cancelled."""
        self.channel.close()

    def is_ready(self, model: str = "") -> bool:
        """Whether the server (or ``model``) is ready to take requests."""
        if model:
            return self.stub.ModelReady(pb.ModelReadyRequest(name=model), metadata=self.metadata).ready
        return self.stub.ServerReady(pb.ServerReadyRequest(), metadata=self.metadata).ready

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        outputs: Iterable[str] = (),
        timeout: float | None = None,
        priority: int | None = None,
        long_text: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one request; ``timeout`` (seconds) becomes the gRPC deadline; ``long_text`` as
        :func:`build_request` takes it.

        Raises:
            grpc.RpcError: with the server's status (INVALID_ARGUMENT, DEADLINE_EXCEEDED, ...).
        """
        request = build_request(model, inputs, outputs=outputs, priority=priority, long_text=long_text)
        return parse_response(self.stub.ModelInfer(request, timeout=timeout, metadata=self.metadata))

    def stream_infer(
        self,
        model: str,
        items: Iterable[Mapping[str, np.ndarray] | tuple[str, Mapping[str, np.ndarray]]],
        *,
        timeout_us: int | None = None,
        max_inflight: int = 128,
    ) -> Iterator[tuple[str, dict[str, np.ndarray] | InferError]]:
        """Send many requests over one ModelStreamInfer call; yield (id, outputs or error).

        ``items`` are input dicts (ids "0", "1", ... are assigned) or (id, inputs) pairs.
        At most ``max_inflight`` requests are unanswered at once, so memory stays flat for
        inputs of any length. Results come in completion order.

        Raises:
            grpc.RpcError: the stream itself failed (not one message).
        """
        window = threading.Semaphore(max_inflight)
        done = object()
        numbered = (
            item if isinstance(item, tuple) else (str(i), item) for i, item in zip(itertools.count(), items)
        )

        def requests() -> Iterator[pb.ModelInferRequest]:
            for request_id, inputs in numbered:
                window.acquire()
                yield build_request(model, inputs, request_id=request_id, timeout_us=timeout_us)

        responses: queue.Queue[object] = queue.Queue()
        call = self.stub.ModelStreamInfer(requests(), metadata=self.metadata)

        def pump() -> None:
            try:
                for message in call:
                    responses.put(message)
            except grpc.RpcError as exc:
                responses.put(exc)
            responses.put(done)

        threading.Thread(target=pump, daemon=True).start()
        try:
            while (message := responses.get()) is not done:
                if isinstance(message, grpc.RpcError):
                    raise message
                window.release()
                response = message.infer_response  # type: ignore[attr-defined]
                if message.error_message:  # type: ignore[attr-defined]
                    params = response.parameters
                    code = params["error_code"].string_param if "error_code" in params else "UNKNOWN"
                    error = InferError(response.id, code, message.error_message)  # type: ignore[attr-defined]
                    yield response.id, error
                else:
                    yield response.id, parse_response(response)
        finally:
            call.cancel()


__all__ = ["Client", "Credentials", "InferError", "build_request", "parse_response", "read_token_file"]
