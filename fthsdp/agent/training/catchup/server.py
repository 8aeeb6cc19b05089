"""The catch-up server: one per rank, plain HTTP/1.1 for the bulk bytes.

Why HTTP and not gRPC: measured on loopback for 256 MiB, Python gRPC
streaming moves 0.25-0.32 GB/s and a plain Python HTTP server about 2.5 GB/s
(docs/measurements.md; benchmarks/catchup.py measures this transport
against a raw socket). gRPC stays the control plane.

Endpoints (every one but /v1/health needs ``Authorization: Bearer <transfer
token>`` when the job has a token: fthsdp/agent/training/catchup/transfer_token.py):

``POST /v1/snapshots``
    Take a snapshot at the next step boundary; answers its
    ``SnapshotManifest`` (protobuf) once the host copy is complete.
``GET /v1/snapshots/<step>/manifest``
    The manifest of a snapshot taken (waits briefly for it to be taken).
``GET /v1/snapshots/<step>/data``
    The raw bytes; a ``Range: bytes=A-`` (or ``A-B``) header resumes an
    interrupted transfer (206). The joiner checks each chunk's CRC-32.
``POST /v1/sessions?store=H:P&prefix=X&backend=B``
    Open a session: a two-rank torch.distributed group with the joiner,
    which meets in its store (fthsdp/agent/training/catchup/group.py);
    answers once the group is built (200) or why not (404: this source has
    none; 403: the store is not at the address the request came from, so
    the source never connects to anyone else; 400, 503).
    ``DELETE /v1/sessions/<X>`` closes it (it also closes after
    ``SESSION_IDLE`` seconds unused, or when a transfer on it fails).
``POST /v1/snapshots/<step>/push?session=X&from=C``
    Send the snapshot's chunks from chunk C on over session X; answers
    once they are sent (200), or why not (404, 409, 503).
``DELETE /v1/snapshots/<step>``
    The joiner is done: release the host copy and the pinned log.
``GET /v1/inputs``
    The recorded inputs of the step this replica is in (a ``LogEntry``
    without data: hyperparameters and small registered state), for a joiner
    that enters the step the members are in.
``GET /v1/log?from=S&max_bytes=N&wait=T``
    Log entries from step S on: a 4-byte big-endian length, a ``LogBatch``,
    then each entry's raw bytes in order. Waits up to T seconds for an entry
    to exist. 410 Gone when step S is no longer held. With ``&session=X``
    the raw bytes go over that session's group instead, after the answer.
"""

from __future__ import annotations

import http.server
import logging
import re
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable

import torch

from fthsdp.agent.training.catchup import transfer_token
from fthsdp.agent.training.catchup.group import (
    LOG_PIECE,
    GroupChannel,
    GroupTransferError,
    OpenSessions,
    Session,
    SessionRequest,
    chunks_of,
    piece_bytes,
    store_host_problem,
)
from fthsdp.agent.training.catchup.source import ServedState, SnapshotUnavailable

log = logging.getLogger("fthsdp.agent.catchup")

PROTOBUF = "application/x-protobuf"
MAX_WAIT = 60.0
_SNAPSHOT = re.compile(r"^/v1/snapshots/(\d+)(/manifest|/data|/push)?$")
_SESSION = re.compile(r"^/v1/sessions/([A-Za-z0-9_.-]+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
WRITE_PIECE = 1 << 20


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    joiner = ""
    """The replica id the request's transfer token names (MAC-protected: for the log)."""

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

    # ----- plumbing ------------------------------------------------------------------

    def _send(self, code: int, body: bytes = b"", content_type: str = "text/plain; charset=utf-8", headers=()) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, message: str, headers=()) -> None:
        self._send(code, (message + "\n").encode(), headers=headers)

    def _authorized(self, store: str = "") -> bool:
        """A transfer token good now for this server (and for ``store``, the
        session store a POST /v1/sessions names), or 401 with one line.

        The raw job token is refused like any malformed token (and not told
        apart from one, which would make this an oracle for it): accepting it
        would leak nothing by itself, but would keep working for a client
        that sends the job token across the data network, in cleartext
        without TLS, and an unbound credential that never expires is what
        the transfer token replaces. fthsdp's own client mints one per request."""
        token = self.server.token
        if not token:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, presented = given.partition(" ")
        try:
            if scheme != "Bearer":
                raise transfer_token.TokenRefused("missing bearer token")
            joiner = transfer_token.verify(presented.strip(), token, self.server.address, self.server.clock(), store)
        except transfer_token.TokenRefused as e:
            log.info("catch-up request from %s refused: %s", self.address_string(), e)
            self._error(401, str(e), headers=(("WWW-Authenticate", "Bearer"),))
            return False
        self.joiner = joiner
        return True

    def _query(self) -> tuple[str, dict[str, str]]:
        parts = urllib.parse.urlsplit(self.path)
        return parts.path, {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query).items()}

    # ----- methods -------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - the base class's naming
        path, query = self._query()
        if path == "/v1/health":
            return self._send(200, b"ok\n")
        if not self._authorized():
            return None
        try:
            if path == "/v1/log":
                return self._log(query)
            if path == "/v1/inputs":
                return self._send(200, self.server.source.inputs(), PROTOBUF)
            m = _SNAPSHOT.match(path)
            if m and m.group(2):
                wait = min(float(query.get("wait", "10")), MAX_WAIT)
                snap = self.server.source.snapshot(int(m.group(1)), wait)
                if m.group(2) == "/manifest":
                    return self._send(200, snap.manifest.SerializeToString(), PROTOBUF)
                return self._data(snap)
        except ValueError as e:
            return self._error(400, f"bad request: {e}")
        except SnapshotUnavailable as e:
            return self._error(404, str(e))
        return self._error(404, f"no such resource: {path}")

    def do_POST(self) -> None:  # noqa: N802
        path, query = self._query()
        if not self._authorized(query.get("store", "") if path == "/v1/sessions" else ""):
            return None
        m = _SNAPSHOT.match(path)
        if m and m.group(2) == "/push":
            return self._push(int(m.group(1)), query)
        if path == "/v1/sessions":
            return self._open_session(query)
        if path != "/v1/snapshots":
            return self._error(404, f"no such resource: {path}")
        try:
            snap = self.server.source.request_snapshot(min(float(query.get("wait", "30")), MAX_WAIT))
        except ValueError as e:
            return self._error(400, f"bad request: {e}")
        except SnapshotUnavailable as e:
            return self._error(503, str(e))
        log.info("snapshot of step %d (%.1f MiB) for %s at %s", snap.step, snap.total_bytes / 2**20,
                 self.joiner or "a joiner", self.address_string())
        return self._send(200, snap.manifest.SerializeToString(), PROTOBUF)

    def do_DELETE(self) -> None:  # noqa: N802
        path, _ = self._query()
        if not self._authorized():
            return None
        session = _SESSION.match(path)
        if session:
            closed = self.server.sessions.close(session.group(1))
            return self._send(204 if closed else 404)
        m = _SNAPSHOT.match(path)
        if not m or m.group(2):
            return self._error(404, f"no such resource: {path}")
        released = self.server.source.release(int(m.group(1)))
        return self._send(204 if released else 404)

    # ----- bodies --------------------------------------------------------------------

    def _data(self, snap) -> None:
        total = snap.total_bytes
        start, end = 0, total
        header = self.headers.get("Range")
        if header:
            m = _RANGE.match(header.strip())
            if not m or int(m.group(1)) > total or (m.group(2) and int(m.group(2)) < int(m.group(1))):
                return self._error(416, f"bad range {header!r} for {total} bytes")
            start = int(m.group(1))
            end = min(total, int(m.group(2)) + 1) if m.group(2) else total
        self.send_response(206 if header else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if header:
            self.send_header("Content-Range", f"bytes {start}-{max(start, end - 1)}/{total}")
        self.end_headers()
        self._write(snap.data()[start:end])
        snap.last_used = time.monotonic()
        return None

    def _open_session(self, query: dict[str, str]) -> None:
        channel = self.server.channel
        if channel is None:
            return self._error(404, "this source sends over HTTP only")
        try:
            request = SessionRequest.parse(query)
        except ValueError as e:
            return self._error(400, f"bad request: {e}")
        problem = store_host_problem(request.store, self.client_address[0])
        if problem:
            log.info("catch-up session refused to %s: %s", self.address_string(), problem)
            return self._error(403, problem)
        try:
            self.server.sessions.add(channel.accept(request))
        except GroupTransferError as e:
            return self._error(503, str(e))
        log.info("catch-up session %s with %s over %s", request.prefix, self.address_string(), channel.name)
        return self._send(200, b"open\n")

    def _push(self, step: int, query: dict[str, str]) -> None:
        try:
            first = int(query.get("from", "0"))
            wait = min(float(query.get("wait", "10")), MAX_WAIT)
            if first < 0:
                raise ValueError(f"from={first}")
        except ValueError as e:
            return self._error(400, f"bad request: {e}")
        session = self.server.sessions.get(query.get("session", ""))
        if session is None:
            return self._error(404, f"no open session {query.get('session', '')!r}")
        try:
            snap = self.server.source.snapshot(step, wait)
        except SnapshotUnavailable as e:
            return self._error(404, str(e))
        if not session.lock.acquire(blocking=False):
            return self._error(409, f"session {session.name} is busy")
        began = time.monotonic()
        try:
            chunk = snap.manifest.chunk_bytes
            piece = piece_bytes(chunk)
            pieces = chunks_of(snap.buffer[: snap.total_bytes], piece, first * (chunk // piece))
            session.send(pieces, pace=Pacer(self.server.max_rate, began))
        except GroupTransferError as e:
            log.info("pushing the snapshot of step %d over session %s: %s", step, session.name, e)
            return self._error(503, str(e))
        finally:
            session.lock.release()
            snap.last_used = time.monotonic()
        log.info("pushed %d pieces of the snapshot of step %d over %s in %.2fs", len(pieces), step,
                 session.channel.name, time.monotonic() - began)
        return self._send(200, f"{len(pieces)} pieces sent\n".encode())

    def _log(self, query: dict[str, str]) -> None:
        start = int(query["from"]) if "from" in query else 0
        max_bytes = int(query.get("max_bytes", str(256 << 20)))
        wait = min(float(query.get("wait", "0")), MAX_WAIT)
        self.server.source.touch(start)
        session = None
        if "session" in query:
            session = self.server.sessions.get(query["session"])
            if session is None:
                return self._error(404, f"no open session {query['session']!r}")
        records, head, oldest = self.server.source.log.read(start, max_bytes, wait)
        try:
            return self._send_log(records, start, head, oldest, session)
        finally:
            self.server.source.log.done(records)  # their buffers may be reused from now on

    def _send_log(self, records, start: int, head: int, oldest: int, session: Session | None) -> None:
        if not records and start < head and start < oldest:
            return self._error(410, f"step {start} is no longer held (oldest {oldest}, head {head})")
        from fthsdp.protos.v1 import catchup_pb2 as cpb

        payloads = [r.payload() for r in records]  # computes the CRCs first
        batch = cpb.LogBatch(entries=[r.entry for r in records], head_step=head, oldest_step=oldest)
        header = batch.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        inline = 0 if session is not None else sum(p.nbytes for p in payloads)
        self.send_header("Content-Length", str(4 + len(header) + inline))
        self.end_headers()
        self.wfile.write(struct.pack(">I", len(header)) + header)
        if session is None:
            for p in payloads:
                self._write(p, rate=0.0)  # never limited: a joiner must replay faster than the members train
            return None
        self.wfile.flush()
        if not session.lock.acquire(timeout=MAX_WAIT):
            return None  # the joiner's receive times out and it goes on over HTTP
        try:
            pieces = [piece for p in payloads
                      for piece in chunks_of(torch.frombuffer(p, dtype=torch.uint8), LOG_PIECE)]
            session.send(pieces)
        except GroupTransferError as e:
            log.info("sending log entries over session %s: %s", session.name, e)
        finally:
            session.lock.release()
        return None

    def _write(self, view: memoryview, rate: float | None = None) -> None:
        pace = Pacer(self.server.max_rate if rate is None else rate)
        if not pace.rate:
            self.wfile.write(view)
            return
        for offset in range(0, view.nbytes, WRITE_PIECE):
            piece = view[offset : offset + WRITE_PIECE]
            self.wfile.write(piece)
            pace(offset + piece.nbytes)


class Pacer:
    """Holds a sender to ``rate`` bytes a second from ``began`` (0: no
    limit): catch-up must not crowd out training traffic."""

    def __init__(self, rate: float, began: float | None = None) -> None:
        self.rate = rate
        self.began = time.monotonic() if began is None else began

    def __call__(self, sent: int) -> None:
        """``sent`` bytes are out: sleep until that is no faster than the rate."""
        ahead = sent / self.rate - (time.monotonic() - self.began) if self.rate else 0.0
        if ahead > 0:
            time.sleep(ahead)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, source: ServedState, token: str, max_rate: float, tls=None,
                 channel: GroupChannel | None = None, clock=time.time) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        if tls is not None:
            # The handshake runs on the connection's own thread, at its first
            # read, so a slow or hostile peer cannot hold up accept().
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.source = source
        self.token = token
        self.clock = clock
        """Unix seconds, for the transfer tokens' expiry."""
        self.address = ""
        """host:port as joiners are told it (CatchUpServer.address): the transfer tokens bind it."""
        self.max_rate = max_rate
        self.channel = channel
        self.sessions = OpenSessions()

    def handle_error(self, request, client_address) -> None:
        # A joiner that died mid-transfer breaks the connection: routine, not a traceback.
        log.info("catch-up connection from %s ended early", client_address[0])


class CatchUpServer:
    """Serve ``source`` on ``host``: port 0 picks a free port; ``address`` has it."""

    def __init__(
        self,
        source: ServedState,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str = "",
        max_rate: float = 0.0,
        tls: ssl.SSLContext | None = None,
        channel: GroupChannel | None = None,
        fingerprint: str = "",
        clock: Callable[[], float] = time.time,
    ):
        """``token``: the job token, the key of the transfer tokens joiners
        present (fthsdp/agent/training/catchup/transfer_token.py); '': no authentication.
        ``tls``: serve HTTPS with this context (fthsdp/agent/training/catchup/tls.py); None: plain HTTP.
        ``fingerprint``: its certificate's, for joiners to pin (``tls.serving``); kept here to be registered.
        ``channel``: push snapshots over torch.distributed when a joiner asks
        (fthsdp/agent/training/catchup/group.py); None: HTTP only.
        ``clock``: unix seconds, for the tokens' expiry."""
        self.fingerprint = fingerprint
        self._server = _Server((host, port), source, token, max_rate, tls, channel, clock)
        bound_host, bound_port = self._server.server_address[:2]
        assert isinstance(bound_host, str)  # an AF_INET(6) socket's own address (typeshed allows bytes)
        shown = host if host not in ("", "0.0.0.0", "::") else bound_host
        self.address = f"[{shown}]:{bound_port}" if ":" in shown else f"{shown}:{bound_port}"
        self._server.address = self.address
        self._thread = threading.Thread(target=self._server.serve_forever, name="fthsdp-catchup-server", daemon=True)

    def start(self) -> CatchUpServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
