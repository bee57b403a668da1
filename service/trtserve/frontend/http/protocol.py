"""uvicorn's httptools protocol with the limits and connection rules it lacks: every resource a
client can hold on the HTTP door is bounded, a half-close is answered, and a request whose client
is gone stops.

uvicorn's only timer is the keep-alive one: it runs only between requests and every byte resets
it, so a client that trickles a header or a body a byte at a time, or one that connects and never
sends a byte, held its connection for ever; it sets no limit on the size or number of
headers; it takes a half-close (the client's FIN after a whole request) for a disconnect and
drops the answer; and it tells a non-streaming application of a disconnect only through
``receive()``, which a handler waiting for its batch never calls, so a request whose client reset
the connection while it was queued still ran. :class:`BoundedProtocol` adds, per connection:

* **one timer** (armed when a request's first byte arrives, re-armed lazily at the current
  deadline, so a kept-alive connection pays about one timer operation per
  :attr:`HttpLimits.header_timeout`, not per request): the headers must be whole within
  ``header_timeout`` of the first byte, and the body must arrive within ``body_timeout`` plus
  one second per ``body_min_rate`` bytes received; past either the request is answered 408 and
  the connection closed;
* the keep-alive timer armed at the connection's start too, so a connection that never sends a
  request is closed after ``keepalive_timeout``;
* header size and count limits: more than ``max_header_bytes`` before the end of the headers, or
  more than ``max_headers`` header lines, is answered 431 and the connection closed;
* a half-close (EOF) with a request outstanding keeps the write side open: the requests sent
  are answered, the last with ``Connection: close``; with none outstanding the connection closes;
* a reset (or close) while a whole request's answer is pending cancels the application task
  with :data:`CLIENT_GONE`, so the request leaves the queue as a cancelled gRPC call does
  (counted CANCELLED); the application returns quietly on that cancellation;
* a drain's shutdown closes only the connections with no request partly received: one that is
  arriving is read and answered (503 while draining, with ``Connection: close``);
* an inference request is handed to the front end's transport hold
  (:mod:`trtserve.frontend.http.hold`), which runs it now or holds it while the concurrency
  window is full; a connection that closes takes its held requests with it.

Each refusal is logged once, as one warning line naming the client and the limit. TLS
(uvicorn's own ``ssl_*`` settings) is unchanged; over TLS a half-close closes the connection, as
asyncio's SSL transport cannot stay half-open.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import is_ssl

if TYPE_CHECKING:
    from trtserve.frontend.http.hold import TransportHold

log = logging.getLogger(__name__)

CLIENT_GONE = "trtserve: the HTTP client closed the connection before its answer"
"""The message of the cancellation of a request whose client is gone (the application returns
quietly on it: there is no one to answer)."""

_IDLE, _HEADERS, _BODY = 0, 1, 2  # where the connection is in its current request


@dataclass(frozen=True)
class HttpLimits:
    """The bounds the HTTP door holds every client to (``trtserve serve --http-*`` flags).

    Attributes:
        header_timeout: seconds from a request's first byte to the end of its headers (408
            beyond, connection closed). Default 30: a client sends its headers in one packet;
            nginx allows 60.
        body_timeout: seconds the body may take before the minimum rate applies (408 beyond,
            connection closed). Default 30.
        body_min_rate: bytes per second the body must average after ``body_timeout``: the body
            must be whole by ``body_timeout + bytes received / body_min_rate`` seconds after the
            headers. Default 65536 (512 kbit/s): a 64 MiB body gets about 17 minutes, a client
            trickling a byte every 2 s is closed after ``body_timeout``. 0: the whole body within
            ``body_timeout``.
        max_header_bytes: largest request line plus headers, bytes (431 beyond, connection
            closed). Default 32768 (nginx's 4 x 8 KiB buffers).
        max_headers: most header lines in one request (431 beyond, connection closed). Default
            100 (Apache's LimitRequestFields).
        keepalive_timeout: seconds a connection may stay idle, before its first request or
            between requests, before the server closes it. Default 5 (uvicorn's).
        window: the inference requests the door runs at once, the rest held unread
            (:mod:`trtserve.frontend.http.hold`): ``None`` (``--http-window auto``) learns it
            while serving (:class:`~trtserve.frontend.window.ConcurrencyWindow`); a number fixes
            it; 0 (the default): no window, every request runs at once. Off by default because
            the bench did not show it paying on 2 cores (docs/benchmarks.md, "The HTTP door's
            concurrency window").

    Raises:
        ValueError: a time that is not > 0, a rate < 0, a size or count < 1, or a window < 0
            (the message names the field and the value).
    """

    header_timeout: float = 30.0
    body_timeout: float = 30.0
    body_min_rate: int = 65536
    max_header_bytes: int = 32768
    max_headers: int = 100
    keepalive_timeout: float = 5.0
    window: int | None = 0

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 0:
            raise ValueError(f"HTTP window must be 'auto' or a whole number >= 0 (0: none), got {self.window}")
        for name in ("header_timeout", "body_timeout", "keepalive_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HTTP {name} must be a number of seconds > 0, got {getattr(self, name)}")
        if self.body_min_rate < 0:
            raise ValueError(f"HTTP body_min_rate must be a number of bytes per second >= 0, got {self.body_min_rate}")
        for name in ("max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                raise ValueError(f"HTTP {name} must be a whole number >= 1, got {getattr(self, name)}")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing and answer ``status`` (then close)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol bounded by ``limits`` (see the module docstring); made by
    uvicorn per connection (``uvicorn.Config(http=functools.partial(BoundedProtocol,
    limits=...))``). Touched only from the event loop's thread."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, limits: HttpLimits,
                 hold: TransportHold | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.hold = hold
        self.timeout_keep_alive = limits.keepalive_timeout  # type: ignore[assignment]  # uvicorn's timer, in seconds
        self._phase = _IDLE
        self._since = 0.0  # loop time the current phase began
        self._received = 0  # bytes read in phase _HEADERS (a bound while headers trickle), or body bytes in _BODY
        self._head = 0  # bytes of the current request's target and headers, as parsed
        self._timer: asyncio.TimerHandle | None = None
        self._running: tuple[RequestResponseCycle, asyncio.Task[None]] | None = None

    # -- the connection ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its keep-alive timer only after an answer: without this a connection
        # that never sends a byte stays open for ever.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        running = self._running
        super().connection_lost(exc)
        if self.hold is not None:
            self.hold.forget(self)
        if running is not None:
            cycle, task = running
            # A whole request whose answer has not begun: its client is gone, so it leaves the
            # queue (a request still being received learns it from receive(), as before).
            if not cycle.more_body and not cycle.response_started and not task.done():
                task.cancel(CLIENT_GONE)

    def eof_received(self) -> bool | None:
        """The client finished sending (a half-close, RFC 9112 section 9.6): answer what it
        sent, the last answer with ``Connection: close``, then close. True keeps the
        transport's write side open; None closes it."""
        last = self.pipeline[0][0] if self.pipeline else self.cycle
        outstanding = last is not None and not last.response_complete and not last.more_body
        if not outstanding or is_ssl(self.transport):
            return None  # nothing to answer, or a body that can never be whole: close
        assert last is not None
        last.keep_alive = False
        self._phase = _IDLE  # a request cut off in its headers is no request
        return True

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self.hold is None or not self.hold.take(self, cycle, app):
            self.run(cycle, app)

    def run(self, cycle: RequestResponseCycle, app: Any) -> asyncio.Task[None]:
        """Start answering ``cycle`` with the ASGI ``app`` (now, or when the hold lets it in);
        returns the task. uvicorn's own start, keeping the task: the one to cancel when the
        client goes (uvicorn's reset_contextvars option is not used by trtserve)."""
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._running = (cycle, task)
        return task

    def shutdown(self) -> None:
        """The server is draining: close the connection unless a request is partly received
        (that one is read, and answered 503 with ``Connection: close``)."""
        if self._phase == _IDLE:
            super().shutdown()

    # -- parsing ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._phase == _IDLE:
            self._begin(_HEADERS)
        if self._phase == _HEADERS:
            self._received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # no WebSocket routes: answered as a plain request
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _Refused):
                self._refuse(exc.__context__.status, str(exc.__context__))
                return
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
            return
        if self._phase == _HEADERS and self._received > self.limits.max_header_bytes:
            self._refuse(431, f"the request's headers are over {self.limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head = 0
        if self._phase == _IDLE:  # a pipelined request begins in the bytes of the one before
            self._begin(_HEADERS)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head += len(name) + len(value) + 4  # ": " and CRLF
        if len(self.headers) > self.limits.max_headers:
            raise _Refused(431, f"the request has more than {self.limits.max_headers} header lines")
        if self._head > self.limits.max_header_bytes:
            raise _Refused(431, f"the request's headers are over {self.limits.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._phase, self._since, self._received = _BODY, self.loop.time(), 0

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._received += len(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _IDLE

    # -- the deadline -------------------------------------------------------------------------

    def _begin(self, phase: int) -> None:
        self._phase, self._since, self._received = phase, self.loop.time(), 0
        if self._timer is None:
            self._timer = self.loop.call_later(self.limits.header_timeout, self._on_timer)

    def _deadline(self) -> float:
        """Loop time by which the current phase must end."""
        if self._phase == _HEADERS:
            return self._since + self.limits.header_timeout
        rate = self.limits.body_min_rate
        return self._since + self.limits.body_timeout + (self._received / rate if rate else 0.0)

    def _on_timer(self) -> None:
        self._timer = None
        if self._phase == _IDLE or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:  # the server holds the reading (a pipelined request waits its turn)
            self._since = now
        deadline = self._deadline()
        if now < deadline:
            self._timer = self.loop.call_at(deadline, self._on_timer)
            return
        where = "headers" if self._phase == _HEADERS else "body"
        self._refuse(408, f"the request's {where} did not arrive in time ({self._limit_words()})")

    def _limit_words(self) -> str:
        limits = self.limits
        if self._phase == _HEADERS:
            return f"--http-header-timeout {limits.header_timeout:g} s"
        return f"--http-body-timeout {limits.body_timeout:g} s, then --http-body-min-rate {limits.body_min_rate} B/s"

    def _refuse(self, status: int, message: str) -> None:
        """Answer the request being received ``status`` and close the connection; where an
        earlier request's answer is still pending, stop reading and close after it instead."""
        client = "%s:%d" % self.client if self.client else "a client"
        log.warning("HTTP %d to %s: %s; closing the connection", status, client, message)
        self._phase = _IDLE
        self.flow.pause_reading()
        last = self.pipeline[0][0] if self.pipeline else self.cycle
        if last is not None and not last.response_complete and last is not self._receiving():
            last.keep_alive = False  # the requests received whole are answered first
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
            return
        body = orjson.dumps({"error": message})
        self.transport.write(b"".join([
            STATUS_LINE[status], b"content-type: application/json\r\n",
            b"content-length: ", str(len(body)).encode(), b"\r\n", b"connection: close\r\n\r\n", body]))
        self.transport.close()

    def _receiving(self) -> RequestResponseCycle | None:
        """The cycle whose body is still arriving, if any."""
        return self.cycle if self.cycle is not None and self.cycle.more_body else None


__all__ = ["CLIENT_GONE", "BoundedProtocol", "HttpLimits"]
