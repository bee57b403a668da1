"""A real trtserve on 127.0.0.1 in a background thread with its own event loop, so tests can
drive it with ordinary blocking clients from many threads and look at its dispatchers.

The engine core and two front ends run on that loop: two ``grpc.aio`` servers sharing one
port (SO_REUSEPORT: the kernel hands each client connection to one of them), each with its
own ZeroMQ connection to the engine core (``ipc://`` in a private temporary directory), as
the processes of ``trtserve serve --frontends 2`` do. The process tree itself (restarts,
signals, a dying engine core) is tested through ``trtserve serve``."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc

from trtserve import runtimes
from trtserve.client import Client
from trtserve.clock import MonotonicClock
from trtserve.engine.core import EngineCore
from trtserve.engine.lifecycle import LifecycleConfig
from trtserve.engine.registry import ModelRegistry
from trtserve.frontend.doors import open_doors
from trtserve.ipc.client import EngineClient
from trtserve.ipc.queries import ServerReady


class ServerThread:
    """``with ServerThread(root) as srv:`` — ``srv.url``, ``srv.client()``, ``srv.registry``
    (the engine core's live models: a :class:`trtserve.engine.registry.ModelRegistry`) and
    ``srv.core`` (the engine core), ``srv.services`` (each front end's inference service;
    ``srv.service`` the first); with ``http=True`` also ``srv.http_url`` (the HTTP door of
    every front end, on one port).

    Args:
        frontends: front ends sharing the port.
        http: open the HTTP door too.
        metrics_port: the engine core's Prometheus endpoint (0: ephemeral; None: off).
        lifecycle: model control mode and readiness (``trtserve.engine.lifecycle``; default none, strict).
        server_kw: the front ends' options (``start_frontend``).
    """

    def __init__(self, root: Path, frontends: int = 2, metrics_port: int | None = None,
                 lifecycle: LifecycleConfig | None = None, http: bool = False, **server_kw) -> None:
        self.root = Path(root)
        self.http = http
        self.http_port: int | None = 0 if http else None
        self.lifecycle = lifecycle
        self.frontends = frontends
        self._metrics_port = metrics_port
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

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

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
        clock = MonotonicClock()
        self.registry = ModelRegistry(self.root, clock=clock, backend_factory=partial(runtimes.create))
        self._dir = tempfile.mkdtemp(prefix="trtserve-test-")
        address = f"ipc://{self._dir}/engine.sock"
        self.core = EngineCore(self.registry, address, metrics_port=self._metrics_port, lifecycle=self.lifecycle)
        await self.core.start()
        await self.core.load()
        self.doors, self.servers, self.services, self.engines = [], [], [], []
        for index in range(self.frontends):
            engine = EngineClient(address, index)
            await engine.connect()
            doors = await open_doors(engine, clock, self.pool, host="127.0.0.1", port=self.port,
                                     http_port=self.http_port, reuse_port=True, **self.server_kw)
            self.port, self.http_port = doors.grpc_port, doors.http_port
            await doors.state.loaded()
            self.doors.append(doors)
            self.servers.append(doors.grpc)
            self.services.append(doors.service)
            self.engines.append(engine)
        self.server, self.service, self.engine = self.servers[0], self.services[0], self.engines[0]

    def metrics_at(self) -> int:
        """The engine core's metrics port, once every request answered so far is counted there
        (the front ends ship their records over ZeroMQ; a query goes behind them)."""
        for engine in self.engines:
            self.call(engine.query(ServerReady()))
        assert self.core.metrics is not None
        return self.core.metrics.port

    @property
    def admitted(self) -> int:
        """Requests admitted and not yet released, over every front end."""
        return sum(s.inflight.active for s in self.services)

    async def _stop(self, grace: float) -> None:
        await asyncio.gather(*(doors.drain(grace) for doors in self.doors))
        await self.core.aclose()
        for engine in self.engines:
            await engine.aclose()

    def stop(self, grace: float = 5.0) -> None:
        if not self._thread.is_alive():
            return
        self.call(self._stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.pool.shutdown(wait=False)
        shutil.rmtree(self._dir, ignore_errors=True)


def code_of(fn, *args, **kw) -> grpc.StatusCode:
    """The status code a blocking call ends with."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK
