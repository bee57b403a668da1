"""The benchmark's Infinity peer: ``infinity-emb`` serving one sentence-transformers model
directory from local files on 127.0.0.1, an ephemeral port.

Run by :mod:`.infinity` with Infinity's own virtual environment, as a script (it imports
nothing from trtserve)::

    python infinity_server.py MODEL_DIR SERVED_NAME BATCH_SIZE

It builds the same FastAPI app as ``infinity_emb v2`` (``infinity_emb.infinity_server.
create_server``: OpenAI-style ``POST /embeddings``, Infinity's dynamic batching of up to
``BATCH_SIZE`` texts per forward pass), with the ``torch`` engine on the CPU, and serves it
with uvicorn (httptools, uvloop: the choices of Infinity's own CLI) on a socket bound here to
port 0, so no port is guessed. Prints ``listening on 127.0.0.1:PORT`` once uvicorn has started,
which is after Infinity's lifespan has loaded and warmed the model. The caller sets the
Hugging Face offline variables (``HF_HUB_OFFLINE`` …) so nothing reaches the network.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
import uvloop
from infinity_emb.args import EngineArgs
from infinity_emb.infinity_server import create_server

HOST = "127.0.0.1"


async def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if server.started:
        print(f"listening on {HOST}:{sock.getsockname()[1]}", flush=True)
    await serving


def main(argv: list[str]) -> int:
    model_dir, name, batch_size = argv[0], argv[1], int(argv[2])
    engine = EngineArgs(model_name_or_path=model_dir, served_model_name=name, batch_size=batch_size,
                        engine="torch", device="cpu", model_warmup=True)
    app = create_server(engine_args_list=[engine], url_prefix="", redirect_slash="", preload_only=False,
                        permissive_cors=False, api_key="", proxy_root_path="")
    sock = socket.socket()
    sock.bind((HOST, 0))
    config = uvicorn.Config(app, http="httptools", loop="uvloop", log_level="warning")
    uvloop.run(_serve(uvicorn.Server(config), sock))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
