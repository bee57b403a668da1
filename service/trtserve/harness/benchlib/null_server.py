"""The transport's floor: a null server that parses each inference request and returns a
canned answer, over the same two doors trtserve serves, for the bench to drive beside it.

Run by the bench as a child process (:func:`null_server`)::

    python -m trtserve.harness.benchlib.null_server

One process, one asyncio loop (as ``trtserve serve --frontends 1``), on 127.0.0.1:

* gRPC (``grpc.aio``, trtserve's own channel options): ``ModelInfer`` parses the
  ``ModelInferRequest`` (protobuf's C++ parser, as trtserve's service does) and answers a
  ``ModelInferResponse`` whose outputs are the request's inputs (so the answer is as large as
  the question); ``ModelReady`` answers ready for every name; ``ModelStatistics`` answers
  every count 0 (the bench then reports no batch size for the floor). Anything else:
  UNIMPLEMENTED.
* HTTP (uvicorn with httptools, set up by trtserve's own
  :func:`~trtserve.frontend.http.server.serve_asgi`): ``POST /v2/models/<m>/infer`` reads
  the whole body, parses its JSON header (the first ``Inference-Header-Content-Length``
  bytes, or all of it) with orjson and answers a JSON header with the inputs' descriptions
  followed by the request's binary part.

So the figures are what grpcio and uvicorn themselves cost per call on this machine, with a
parse of the request and no model: trtserve's server CPU per call divided by the floor's is
the share its own code adds (:mod:`.floor` sets its targets in that ratio). Prints
``HTTP on 127.0.0.1:PORT`` and then ``listening on 127.0.0.1:PORT`` (the lines
:class:`~trtserve.testing.child_server.ChildServer` reads); stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

import grpc
import orjson

from trtserve._proto.inference import grpc_service_pb2 as pb
from trtserve.client import CHANNEL_OPTIONS
from trtserve.frontend.http.server import listening_socket, serve_asgi
from trtserve.testing import ChildServer

HOST = "127.0.0.1"
SERVICE = "inference.GRPCInferenceService"
HEADER_LENGTH = b"inference-header-content-length"


async def _model_infer(request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    for tensor in request.inputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    response.raw_output_contents.extend(request.raw_input_contents)
    return response


async def _model_ready(request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
    return pb.ModelReadyResponse(ready=True)


async def _model_statistics(request: pb.ModelStatisticsRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
    response = pb.ModelStatisticsResponse()
    response.model_stats.add(name=request.name, version=request.version)  # no count: it runs no model
    return response


def _handler() -> grpc.GenericRpcHandler:
    methods = {"ModelInfer": (_model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
               "ModelReady": (_model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
               "ModelStatistics": (_model_statistics, pb.ModelStatisticsRequest, pb.ModelStatisticsResponse)}
    return grpc.method_handlers_generic_handler(SERVICE, {
        name: grpc.unary_unary_rpc_method_handler(call, request_deserializer=request.FromString,
                                                  response_serializer=response.SerializeToString)
        for name, (call, request, response) in methods.items()})


async def _rest_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """ASGI: the null answer to ``POST /v2/models/<m>/infer``; 404 for any other route."""
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    if scope["method"] != "POST" or not scope["path"].endswith("/infer"):
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    length = int(dict(scope["headers"]).get(HEADER_LENGTH, len(body)))
    header = orjson.loads(body[:length])
    answer = orjson.dumps({"model_name": scope["path"].split("/")[3], "outputs": [
        {"name": t["name"], "datatype": t["datatype"], "shape": t["shape"],
         "parameters": {"binary_data_size": t.get("parameters", {}).get("binary_data_size", 0)}}
        for t in header.get("inputs", [])]})
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/octet-stream"), (b"inference-header-content-length", str(len(answer)).encode()),
        (b"content-length", str(len(answer) + len(body) - length).encode())]})
    await send({"type": "http.response.body", "body": answer + body[length:]})


async def _serve() -> None:
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((_handler(),))
    grpc_port = server.add_insecure_port(f"{HOST}:0")
    await server.start()
    http = await serve_asgi(_rest_app, listening_socket(HOST, 0, reuse_port=False))
    print(f"HTTP on {HOST}:{http.port}", flush=True)
    print(f"listening on {HOST}:{grpc_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await http.stop(0)
    await server.stop(0)


def null_server(args: Sequence[str] = ()) -> ChildServer:
    """The null server as a child process (a context manager; ``.url`` the gRPC address,
    ``.http_url`` the HTTP one), started with this interpreter and ``args`` before the module."""
    return ChildServer([sys.executable, *args, "-m", __name__], name="the null server", start_timeout=60.0)


if __name__ == "__main__":
    asyncio.run(_serve())
