"""The joiner's side of the catch-up transport (see fthsdp/agent/training/catchup_server.py).

``SourceClient`` talks to one rank of the source replica over one keep-alive
HTTP connection. A snapshot is read straight into one host buffer, chunk by
chunk; each chunk is checked against the manifest's CRC-32, and a broken
connection or a bad chunk resumes with a ``Range`` request from the first
chunk not yet verified, up to ``attempts`` times, before the source is given
up (``SourceUnavailable``: the caller moves to another source).
"""

from __future__ import annotations

import collections
import concurrent.futures
import http.client
import logging
import ssl
import struct
import zlib
from collections.abc import Callable

import torch

from fthsdp.agent.training.catchup_group import GroupChannel, PushRequest
from fthsdp.agent.training.state_codec import dtype_from_name
from fthsdp.core.errors import FthsdpError
from fthsdp.protos.v1 import catchup_pb2 as cpb

log = logging.getLogger("fthsdp.agent.catchup")


class CatchUpError(FthsdpError):
    """Catch-up from this source cannot go on (the caller retries elsewhere)."""


class SourceUnavailable(CatchUpError):
    """The source did not answer, broke off, or kept sending bad bytes."""


class LogGone(CatchUpError):
    """The source no longer holds the log entries this joiner needs."""


class Unauthorized(CatchUpError):
    """The source refused this joiner's token."""


def _read_exact(response: http.client.HTTPResponse, view: memoryview) -> None:
    got = 0
    while got < view.nbytes:
        n = response.readinto(view[got:])
        if not n:
            raise http.client.IncompleteRead(b"", view.nbytes - got)
        got += n


class SourceClient:
    def __init__(
        self, address: str, token: str = "", timeout: float = 30.0, attempts: int = 3,
        tls: ssl.SSLContext | None = None, channel: GroupChannel | None = None,
    ) -> None:
        """``tls``: talk HTTPS with this context (fthsdp/agent/training/catchup_tls.py); None: plain HTTP.
        ``channel``: fetch a snapshot's bytes over torch.distributed first
        (fthsdp/agent/training/catchup_group.py), HTTP taking over from where it broke off."""
        host, _, port = address.rpartition(":")
        self._tls = tls
        self._channel = channel
        self._token = token
        self.address = address
        self._host, self._port = host.strip("[]"), int(port)
        self._timeout = timeout
        self._attempts = attempts
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn: http.client.HTTPConnection | None = None

    @property
    def transport(self) -> str:
        if self._channel is not None:
            return self._channel.name
        return "https" if self._tls is not None else "http"

    def push(self, step: int, request: PushRequest) -> None:
        """Ask the source to send the snapshot of ``step`` over a group (on a
        connection of its own: the answer comes once the bytes are sent)."""
        other = SourceClient(self.address, self._token, timeout=self._timeout, tls=self._tls)
        try:
            response = other._request("POST", f"/v1/snapshots/{step}/push?{request.query()}",
                                      timeout=2 * self._timeout)
            other._body(response, f"push of the snapshot of step {step}")
        finally:
            other.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ----- requests ------------------------------------------------------------------

    def _request(self, method: str, path: str, headers: dict | None = None, timeout: float | None = None):
        """One request; returns the response (body unread). Retries once on a
        stale keep-alive connection, then raises SourceUnavailable."""
        for retry in range(2):
            if self._conn is None:
                if self._tls is not None:
                    self._conn = http.client.HTTPSConnection(
                        self._host, self._port, timeout=timeout or self._timeout, context=self._tls
                    )
                else:
                    self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout or self._timeout)
            elif timeout is not None:
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
            try:
                self._conn.request(method, path, headers={**self._headers, **(headers or {})})
                response = self._conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if retry:
                    raise SourceUnavailable(f"catch-up source {self.address}: {e}") from e
                continue
            if response.status == 401:
                response.read()
                raise Unauthorized(f"catch-up source {self.address} refused the token (401)")
            return response
        raise AssertionError("unreachable")

    def _body(self, response, what: str) -> bytes:
        try:
            body = response.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise SourceUnavailable(f"catch-up source {self.address}: {what}: {e}") from e
        if response.status >= 300:
            text = body.decode(errors="replace").strip()
            raise SourceUnavailable(f"catch-up source {self.address}: {what}: {response.status} {text}")
        return body

    def request_snapshot(self, wait: float = 30.0) -> cpb.SnapshotManifest:
        response = self._request("POST", f"/v1/snapshots?wait={wait:g}", timeout=wait + self._timeout)
        return cpb.SnapshotManifest.FromString(self._body(response, "snapshot request"))

    def manifest(self, step: int, wait: float = 10.0) -> cpb.SnapshotManifest:
        response = self._request("GET", f"/v1/snapshots/{step}/manifest?wait={wait:g}", timeout=wait + self._timeout)
        return cpb.SnapshotManifest.FromString(self._body(response, f"manifest of step {step}"))

    def inputs(self) -> cpb.LogEntry:
        """The recorded inputs of the step the source is in (see fthsdp/agent/training/train_state.py)."""
        response = self._request("GET", "/v1/inputs")
        return cpb.LogEntry.FromString(self._body(response, "step inputs"))

    def release(self, step: int) -> None:
        try:
            response = self._request("DELETE", f"/v1/snapshots/{step}")
            response.read()
        except CatchUpError as e:
            log.debug("releasing snapshot %d: %s", step, e)

    def fetch(
        self,
        manifest: cpb.SnapshotManifest,
        progress: Callable[[int], None] = lambda n: None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The snapshot's bytes, verified; ``progress(bytes_so_far)`` after
        each chunk. ``out``: a uint8 buffer of ``total_bytes`` to fill (a
        fresh one is allocated otherwise)."""
        total, size = manifest.total_bytes, manifest.chunk_bytes
        chunks = (total + size - 1) // size if size > 0 else 0
        if size <= 0 or len(manifest.chunk_crc32) != chunks:
            raise CatchUpError(f"malformed manifest: {len(manifest.chunk_crc32)} CRCs for {chunks} chunks")
        data = torch.empty(total, dtype=torch.uint8) if out is None else out
        if data.dtype != torch.uint8 or data.numel() != total or not data.is_contiguous():
            raise ValueError(f"out must be a contiguous uint8 tensor of {total} bytes")
        view = data.numpy().data.cast("B")
        done, failures = 0, 0  # ``done``: chunks received *and* verified
        if self._channel is not None and chunks:
            done = self._channel.receive(lambda request: self.push(manifest.step, request), manifest, data, 0,
                                         progress)
        # Each chunk's CRC is checked on a helper thread while the next one is
        # received (zlib and the socket both release the GIL), so the check
        # costs little of the transfer's time.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fthsdp-crc") as checker:
            while done < chunks:
                pending: collections.deque = collections.deque()
                try:
                    response = self._request(
                        "GET", f"/v1/snapshots/{manifest.step}/data", {"Range": f"bytes={done * size}-"}
                    )
                    if response.status != 206:
                        self._body(response, f"snapshot data of step {manifest.step}")
                        raise SourceUnavailable(f"catch-up source {self.address}: expected 206, got {response.status}")
                    received = done
                    while done < chunks:
                        if received < chunks:
                            chunk = view[received * size : min(total, (received + 1) * size)]
                            _read_exact(response, chunk)
                            pending.append((received, checker.submit(zlib.crc32, chunk)))
                            received += 1
                        if pending and (received == chunks or len(pending) > 1):
                            index, crc = pending.popleft()
                            if crc.result() != manifest.chunk_crc32[index]:
                                raise _BadChunk(
                                    f"chunk {index} of the snapshot of step {manifest.step} failed its CRC check"
                                )
                            done = index + 1
                            progress(min(total, done * size))
                except (OSError, http.client.HTTPException, _BadChunk) as e:
                    self.close()
                    for _, crc in pending:
                        crc.cancel()
                    failures += 1
                    if failures >= self._attempts:
                        raise SourceUnavailable(f"catch-up source {self.address}: {e} ({failures} attempts)") from e
                    log.warning(
                        "snapshot transfer from %s interrupted (%s); resuming at chunk %d", self.address, e, done
                    )
        return data

    def log(self, from_step: int, max_bytes: int = 256 << 20, wait: float = 0.0):
        """Entries from ``from_step`` on: (list of (LogEntry, tensor), head step, oldest step)."""
        response = self._request(
            "GET", f"/v1/log?from={from_step}&max_bytes={max_bytes}&wait={wait:g}", timeout=wait + self._timeout
        )
        if response.status == 410:
            raise LogGone(self._body_text(response))
        try:
            if response.status != 200:
                self._body(response, "log")
            (length,) = struct.unpack(">I", response.read(4))
            batch = cpb.LogBatch.FromString(response.read(length))
            out = []
            for entry in batch.entries:
                data = torch.empty(entry.numel, dtype=dtype_from_name(entry.dtype))
                view = data.view(torch.uint8).numpy().data.cast("B")
                _read_exact(response, view)
                if entry.numel and zlib.crc32(view) != entry.crc32:
                    raise _BadChunk(f"log entry of step {entry.step} failed its CRC check")
                out.append((entry, data))
        except (OSError, http.client.HTTPException, struct.error, _BadChunk) as e:
            self.close()
            raise SourceUnavailable(f"catch-up source {self.address}: log: {e}") from e
        return out, batch.head_step, batch.oldest_step

    def _body_text(self, response) -> str:
        try:
            return response.read().decode(errors="replace").strip()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            return str(e)


class _BadChunk(Exception):
    pass
