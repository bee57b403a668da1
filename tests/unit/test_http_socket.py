"""The HTTP door's listening socket: its connections get TCP_NODELAY from asyncio, so a
response's header and body writes never wait on the client's delayed ACK."""

from __future__ import annotations

import asyncio
import socket

from trtserve.frontend.http.server import listening_socket


def test_accepted_connections_have_tcp_nodelay():
    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        sock = listening_socket("127.0.0.1", 0, reuse_port=False)
        server = await asyncio.start_server(connected, sock=sock)
        _reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) != 0


def test_a_port_in_use_is_refused_naming_the_address():
    first = listening_socket("127.0.0.1", 0, reuse_port=False)
    try:
        port = first.getsockname()[1]
        try:
            listening_socket("127.0.0.1", port, reuse_port=False)
        except RuntimeError as exc:
            assert f"127.0.0.1:{port}" in str(exc)
        else:
            raise AssertionError("a second socket bound the same port")
    finally:
        first.close()
