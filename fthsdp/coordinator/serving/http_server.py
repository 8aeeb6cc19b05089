"""The coordinator's HTTP server (``--metrics-port``): aiohttp on the coordinator's asyncio loop.

aiohttp speaks the protocol (parsing, keep-alive, HEAD, chunked bodies); this
module adapts its requests to the small ``Request``/``Response`` pair that the
routes in fthsdp/coordinator/serving/web.py take and return, and keeps the limits a
port that any browser or scanner can reach needs: the request head, the body
and the time a client may take to send them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("fthsdp.coordinator.http")

MAX_HEAD_BYTES = 16 * 1024
"""Request line and headers; a longer head is refused (431)."""
MAX_LINE_BYTES = 4 * MAX_HEAD_BYTES
"""aiohttp's own limit on the request line and on each header, checked while
it parses: a line longer than this is refused before the head is complete (400)."""
MAX_HEADERS = 100
"""aiohttp refuses a head with more header lines (400)."""
MAX_BODY_BYTES = 64 * 1024
"""Admin actions carry no real body; a larger one is refused (413)."""
READ_TIMEOUT = 10.0
"""A client that sends its request slower than this is dropped; an idle
kept-alive connection is closed after as long."""

_COMMON_HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"))


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    """Percent-decoded path, without the query."""
    query: dict[str, str]
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes = b""


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """A started server: ``sockets`` (the bound port is
    ``sockets[0].getsockname()[1]``), ``close()`` and ``wait_closed()``, as
    asyncio's own server has."""

    def __init__(self, server: asyncio.Server, runner: web.AppRunner) -> None:
        self._server = server
        self._runner = runner
        self._closing: asyncio.Future[None] | None = None

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return self._server.sockets

    def close(self) -> None:
        """Stop listening; open connections are closed on the loop (``wait_closed`` waits for that)."""
        if self._closing is None:
            self._server.close()
            self._closing = asyncio.ensure_future(self._runner.cleanup())

    async def wait_closed(self) -> None:
        self.close()
        assert self._closing is not None
        await self._closing
        await self._server.wait_closed()


def _reply(response: Response, close: bool = False) -> web.Response:
    headers = [("Content-Type", response.content_type), *_COMMON_HEADERS, *response.headers]
    reply = web.Response(status=response.status, body=response.body, headers=headers)
    if close:
        reply.force_close()
    return reply


def _head_bytes(request: web.BaseRequest) -> int:
    """The request head's size as sent: request line, header lines, blank line."""
    line = len(request.method) + 1 + len(request.raw_path) + len(" HTTP/1.1\r\n")
    return line + sum(len(name) + 2 + len(value) + 2 for name, value in request.raw_headers) + 2


class _Adapter:
    """aiohttp's requests in, ``handler``'s answers out, within the limits."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.protocols: web.Server | None = None
        """aiohttp's protocol factory, once the runner is set up."""
        self._loop = asyncio.get_running_loop()
        self._first_request: dict[object, asyncio.TimerHandle] = {}
        """Connections whose first request has not arrived, with the time it must by."""

    def protocol(self) -> web.RequestHandler:
        """A new connection's protocol. aiohttp closes an idle kept-alive
        connection (keepalive_timeout), but it has no limit on the time to
        send a first request: this drops a client that does not in time."""
        assert self.protocols is not None
        connection = self.protocols()

        def expire() -> None:
            if self._first_request.pop(connection, None) is not None:
                connection.force_close()

        self._first_request[connection] = self._loop.call_later(READ_TIMEOUT, expire)
        return connection

    async def serve(self, request: web.Request) -> web.Response:
        deadline = self._first_request.pop(request.protocol, None)
        if deadline is not None:
            deadline.cancel()
        if _head_bytes(request) > MAX_HEAD_BYTES:
            return _reply(Response(431, b"request head too large\n"), close=True)
        too_large = Response(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes\n".encode())
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:  # refused before any of it is read
            return _reply(too_large, close=True)
        body = b""
        if request.body_exists:
            # What is left of the first request's time, else all of it.
            left = deadline.when() - self._loop.time() if deadline is not None else READ_TIMEOUT
            try:
                body = await asyncio.wait_for(request.read(), max(left, 0.0))
            except web.HTTPRequestEntityTooLarge:  # a chunked body past client_max_size
                return _reply(too_large, close=True)
            except (TimeoutError, ConnectionError):  # stalled or gone: the answer may not arrive
                return _reply(Response(408, b"request body not received in time\n"), close=True)
        ours = Request(
            request.method, request.path, dict(parse_qsl(request.query_string)),
            {name.lower(): value for name, value in request.headers.items()}, body,
        )
        try:
            return _reply(await self._handler(ours))
        except Exception:  # one bad request must not take the server down
            log.exception("HTTP request failed")
            return _reply(Response(500, b"internal error; see the coordinator's log\n"))


class _QuietParseErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (a port scanner, a typo) as an
    error with a traceback, though the fault is the client's: one line at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        record.msg = f"{record.msg}: %s"
        record.args = (*(record.args if isinstance(record.args, tuple) else ()), error.message)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return _protocol_log.isEnabledFor(logging.INFO)


_protocol_log = logging.getLogger("fthsdp.coordinator.http.protocol")
_protocol_log.addFilter(_QuietParseErrors())


async def serve_http(handler: Handler, host: str, port: int) -> HttpServer:
    """Serve ``handler`` on HOST:PORT (port 0: a free one); the caller closes the server."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, logger=_protocol_log, shutdown_timeout=1.0,
        keepalive_timeout=READ_TIMEOUT, max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES,
        max_headers=MAX_HEADERS,
    )
    adapter = _Adapter(handler)
    app.router.add_route("*", "/{path:.*}", adapter.serve)
    await runner.setup()
    adapter.protocols = runner.server
    try:
        server = await asyncio.get_running_loop().create_server(adapter.protocol, host, port)
    except BaseException:
        await runner.cleanup()
        raise
    return HttpServer(server, runner)
