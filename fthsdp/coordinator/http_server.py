"""A small HTTP/1.1 server on the coordinator's asyncio loop (``--metrics-port``).

One request per connection, no keep-alive, no chunked bodies: enough for a
Prometheus scraper, a browser polling the status page and ``curl`` posting an
admin action, with nothing to install and no thread beside the loop. The
routes are in fthsdp/coordinator/web.py; this module only speaks the protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

log = logging.getLogger("fthsdp.coordinator.http")

MAX_HEAD_BYTES = 16 * 1024
"""Request line and headers; a longer head is refused (431)."""
MAX_BODY_BYTES = 64 * 1024
"""Admin actions carry no real body; a larger one is refused (413)."""
READ_TIMEOUT = 10.0
"""A client that sends its request slower than this is dropped."""


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


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_request(reader: asyncio.StreamReader) -> Request:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(431, "request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "not an HTTP/1.x request line")
    method, target, _ = parts
    headers = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest(400, f"malformed header line {line[:40]!r}")
            headers[name.strip().lower()] = value.strip()
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise BadRequest(400, "Content-Length is not a number") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise BadRequest(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BadRequest(411, "chunked request bodies are not accepted; send Content-Length")
    body = await reader.readexactly(length) if length else b""
    url = urlsplit(target)
    return Request(method, unquote(url.path), dict(parse_qsl(url.query)), headers, body)


def encode_response(response: Response, head_only: bool = False) -> bytes:
    phrase = http.HTTPStatus(response.status).phrase
    headers = [
        ("Content-Type", response.content_type),
        ("Content-Length", str(len(response.body))),
        ("Cache-Control", "no-store"),
        ("X-Content-Type-Options", "nosniff"),
        ("Connection", "close"),
        *response.headers,
    ]
    head = f"HTTP/1.1 {response.status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("latin-1") + (b"" if head_only else response.body)


async def serve_http(handler: Handler, host: str, port: int) -> asyncio.base_events.Server:
    """Serve ``handler`` on HOST:PORT (port 0: a free one); the caller closes the server."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head_only = False
        try:
            try:
                request = await asyncio.wait_for(read_request(reader), timeout=READ_TIMEOUT)
                head_only = request.method == "HEAD"
                response = await handler(request)
            except BadRequest as e:
                response = Response(e.status, f"{e}\n".encode())
            except Exception:  # one bad request must not take the server down
                log.exception("HTTP request failed")
                response = Response(500, b"internal error; see the coordinator's log\n")
            writer.write(encode_response(response, head_only))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            writer.close()

    return await asyncio.start_server(connection, host, port, limit=MAX_HEAD_BYTES)
