"""A real trtserve gRPC server on 127.0.0.1 in a background thread with its own event loop,
so tests can drive it with ordinary blocking clients from many threads."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc

from trtserve import runtimes
from trtserve.client import Client
from trtserve.clock import MonotonicClock
from trtserve.repository import Repository
from trtserve.server import drain, start_server


class ServerThread:
    """``with ServerThread(root) as srv:`` — ``srv.url``, ``srv.client()``, ``srv.repository``."""

    def __init__(self, root: Path, **server_kw) -> None:
        self.root = Path(root)
        self.server_kw = server_kw
        self.loop = asyncio.new_event_loop()
        self.pool = ThreadPoolExecutor(2)
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> Client:
        return Client(self.url)

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(120)
        if self._error is not None:
            raise self._error
        return self

    def call(self, coro):
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.repository = Repository(
            self.root, clock=MonotonicClock(), pool=self.pool, backend_factory=partial(runtimes.create)
        )
        await self.repository.load_all()
        self.server, self.service, self.port = await start_server(self.repository, host="127.0.0.1", port=0, **self.server_kw)

    def stop(self, grace: float = 5.0) -> None:
        if not self._thread.is_alive():
            return
        self.call(drain(self.server, self.service, self.repository, grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.pool.shutdown(wait=False)


def code_of(fn, *args, **kw) -> grpc.StatusCode:
    """The status code a blocking call ends with."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK
