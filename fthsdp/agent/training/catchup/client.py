"""The joiner's side of the catch-up transport (see fthsdp/agent/training/catchup/server.py).

``SourceClient`` talks to one rank of the source replica over one keep-alive
HTTP connection. A snapshot is read straight into one host buffer, chunk by
chunk; each chunk is checked against the manifest's digest (XXH3-64), and a broken
connection or a bad chunk resumes with a ``Range`` request from the first
chunk not yet verified, up to ``attempts`` times, before the source is given
up (``SourceUnavailable``: the caller moves to another source).

Every request carries a transfer token it mints for that request
(fthsdp/agent/training/catchup/transfer_token.py), never the job token. Over
pinned TLS (fthsdp/agent/training/catchup/tls.py) each new connection checks
the source's certificate against the fingerprint the coordinator named.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hmac
import http.client
import logging
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence

import torch

from fthsdp.agent.training.catchup import tls as catchup_tls
from fthsdp.agent.training.catchup import transfer_token
from fthsdp.agent.training.catchup.group import (
    LOG_PIECE,
    GroupChannel,
    GroupTransferError,
    Session,
    chunks_of,
    piece_bytes,
)
from fthsdp.agent.training.state.checksum import digest64
from fthsdp.agent.training.state.codec import dtype_from_name
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


class WrongCertificate(CatchUpError):
    """The source's certificate is not the one the coordinator named (or none was named)."""


class _PinnedConnection(http.client.HTTPSConnection):
    """HTTPS to a source whose certificate is pinned by its SHA-256
    fingerprint: the context verifies nothing (no CA signed it), so the
    check after the handshake is the whole of the source's authentication."""

    def __init__(self, *args, pin: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pin = pin

    def connect(self) -> None:
        super().connect()
        assert isinstance(self.sock, ssl.SSLSocket)
        got = catchup_tls.fingerprint(self.sock.getpeercert(binary_form=True) or b"")
        if not hmac.compare_digest(got, self._pin):
            self.close()
            raise WrongCertificate(f"catch-up source {self.host}:{self.port} presented a certificate with "
                                   f"fingerprint {got}, not {self._pin} as the coordinator named it: refused")


def chunk_digests(manifest: cpb.SnapshotManifest) -> tuple[Callable[[memoryview], int], Sequence[int]]:
    """How a snapshot's chunks are checked: each one's XXH3-64, or its CRC-32
    from a source older than XXH3 (fthsdp/protos/v1/catchup.proto)."""
    if manifest.chunk_xxh3 or not manifest.chunk_crc32:
        return digest64, manifest.chunk_xxh3
    return zlib.crc32, manifest.chunk_crc32


def entry_intact(entry: cpb.LogEntry, view: memoryview) -> bool:
    """A logged sum's bytes match the digest its source sent (XXH3-64, or an older source's CRC-32)."""
    if entry.xxh3 or not entry.crc32:
        return digest64(view) == entry.xxh3
    return zlib.crc32(view) == entry.crc32


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
        tls: ssl.SSLContext | None = None, channel: GroupChannel | None = None, *,
        joiner: str = "", fingerprint: str = "", bind: str = "", clock: Callable[[], float] = time.time,
    ) -> None:
        """``token``: the job token, the key of the transfer tokens each
        request carries ('' : none). ``joiner``: this replica's id, which
        they name. ``tls``: talk HTTPS with this context
        (fthsdp/agent/training/catchup/tls.py); None: plain HTTP.
        ``fingerprint``: pin the source's certificate (required with a
        context that verifies nothing: pinned TLS). ``bind``: the local
        address connections come from (the replica's advertised host: the
        address a session's store is on, which the source insists on).
        ``channel``: fetch a snapshot's bytes over torch.distributed first
        (fthsdp/agent/training/catchup/group.py), HTTP taking over from where it broke off.
        ``clock``: unix seconds, for the tokens' expiry."""
        host, _, port = address.rpartition(":")
        self._tls = tls
        self._channel = channel
        self._session: Session | None = None
        """The group to the source, opened by the first snapshot fetched over it."""
        self._token = token
        self._joiner, self._fingerprint, self._bind, self._clock = joiner, fingerprint, bind, clock
        self.address = address
        self._host, self._port = host.strip("[]"), int(port)
        self._timeout = timeout
        self._attempts = attempts
        self._conn: http.client.HTTPConnection | None = None

    @property
    def transport(self) -> str:
        if self._channel is not None:
            return self._channel.name
        return "https" if self._tls is not None else "http"

    def close(self) -> None:
        """Done with this source: its session (if any) and the connection."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                self._request("DELETE", f"/v1/sessions/{session.name}").read()
            except (CatchUpError, OSError, http.client.HTTPException) as e:
                log.debug("closing session %s: %s", session.name, e)
            session.close()
        self._disconnect()

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _post_elsewhere(self, path: str, what: str, store: str = "") -> None:
        """A POST on a connection of its own (its answer comes once the source
        is done, while this one receives meanwhile)."""
        other = SourceClient(self.address, self._token, timeout=self._timeout, tls=self._tls, joiner=self._joiner,
                             fingerprint=self._fingerprint, bind=self._bind, clock=self._clock)
        try:
            other._body(other._request("POST", path, timeout=2 * self._timeout, store=store), what)
        finally:
            other._disconnect()

    def _group_session(self) -> Session | None:
        """The open session to this source, opened on first use; None once
        the group path failed or the source has none (HTTP from then on)."""
        if self._channel is None:
            return None
        if self._session is None:
            try:
                self._session = self._channel.open(
                    lambda request: self._post_elsewhere(f"/v1/sessions?{request.query()}", "session",
                                                         store=request.store))
            except GroupTransferError as e:
                self._fall_back(e)
        return self._session

    def _fall_back(self, error: BaseException) -> None:
        """The group path failed: HTTP for everything from now on with this source."""
        log.warning("catch-up from %s over %s failed (%s); going on over HTTP", self.address,
                    self._channel.name if self._channel is not None else "a group", error)
        self._channel = None
        session, self._session = self._session, None
        if session is not None:
            session.close()

    # ----- requests ------------------------------------------------------------------

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        source = (self._bind, 0) if self._bind and self._bind not in ("0.0.0.0", "::") else None
        if self._tls is None:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout, source_address=source)
        if self._tls.verify_mode == ssl.CERT_NONE:  # pinned TLS: the fingerprint is the only check
            if not self._fingerprint:
                raise WrongCertificate(f"catch-up source {self.address}: the coordinator named no certificate "
                                       "fingerprint for it, and catch-up here uses TLS with pinned certificates")
            return _PinnedConnection(self._host, self._port, timeout=timeout, source_address=source,
                                     context=self._tls, pin=self._fingerprint)
        return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, source_address=source,
                                           context=self._tls)

    def _authorization(self, store: str) -> dict[str, str]:
        """A transfer token for one request (none without a job token):
        minted per request, so none lives longer than a request needs."""
        if not self._token:
            return {}
        return {"Authorization": "Bearer " + transfer_token.mint(self._token, self.address, self._joiner,
                                                                 self._clock(), store)}

    def _request(self, method: str, path: str, headers: dict | None = None, timeout: float | None = None,
                 store: str = ""):
        """One request; returns the response (body unread). Retries once on a
        stale keep-alive connection, then raises SourceUnavailable.
        ``store``: the session store a ``POST /v1/sessions`` names (its token binds it)."""
        for retry in range(2):
            if self._conn is None:
                self._conn = self._connection(timeout or self._timeout)
            elif timeout is not None:
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
            try:
                self._conn.request(method, path, headers={**self._authorization(store), **(headers or {})})
                response = self._conn.getresponse()
            except WrongCertificate:
                self._disconnect()
                raise
            except (OSError, http.client.HTTPException) as e:
                self._disconnect()
                if retry:
                    raise SourceUnavailable(f"catch-up source {self.address}: {e}") from e
                continue
            if response.status == 401:
                raise Unauthorized(f"catch-up source {self.address} refused the token (401): "
                                   f"{response.read().decode(errors='replace').strip()}")
            return response
        raise AssertionError("unreachable")

    def _body(self, response, what: str) -> bytes:
        try:
            body = response.read()
        except (OSError, http.client.HTTPException) as e:
            self._disconnect()
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
        """The recorded inputs of the step the source is in (see fthsdp/agent/training/state/train_state.py)."""
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
        digest, expected = chunk_digests(manifest)
        if size <= 0 or len(expected) != chunks:
            raise CatchUpError(f"malformed manifest: {len(expected)} chunk digests for {chunks} chunks")
        data = torch.empty(total, dtype=torch.uint8) if out is None else out
        if data.dtype != torch.uint8 or data.numel() != total or not data.is_contiguous():
            raise ValueError(f"out must be a contiguous uint8 tensor of {total} bytes")
        view = data.numpy().data.cast("B")
        done, failures = 0, 0  # ``done``: chunks received *and* verified
        if self._channel is not None and chunks:
            done = self._fetch_over_group(manifest, data, progress)
        # Each chunk's digest is checked on a helper thread while the next one is
        # received (xxhash and the socket both release the GIL), so the check
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
                            pending.append((received, checker.submit(digest, chunk)))
                            received += 1
                        if pending and (received == chunks or len(pending) > 1):
                            index, crc = pending.popleft()
                            if crc.result() != expected[index]:
                                raise _BadChunk(
                                    f"chunk {index} of the snapshot of step {manifest.step} failed its digest check"
                                )
                            done = index + 1
                            progress(min(total, done * size))
                except (OSError, http.client.HTTPException, _BadChunk) as e:
                    self._disconnect()
                    for _, crc in pending:
                        crc.cancel()
                    failures += 1
                    if failures >= self._attempts:
                        raise SourceUnavailable(f"catch-up source {self.address}: {e} ({failures} attempts)") from e
                    log.warning(
                        "snapshot transfer from %s interrupted (%s); resuming at chunk %d", self.address, e, done
                    )
        return data

    def _fetch_over_group(self, manifest: cpb.SnapshotManifest, data: torch.Tensor,
                          progress: Callable[[int], None]) -> int:
        """The snapshot's chunks over the session, each digest-checked; returns
        how many arrived intact (all, or fewer: HTTP goes on from there)."""
        session = self._group_session()
        if session is None:
            return 0
        view = data.numpy().data.cast("B")
        size = manifest.chunk_bytes
        digest, expected = chunk_digests(manifest)
        asked: list[BaseException] = []

        def ask() -> None:
            try:
                self._post_elsewhere(f"/v1/snapshots/{manifest.step}/push?session={session.name}&from=0",
                                     f"push of the snapshot of step {manifest.step}")
            except CatchUpError as e:
                asked.append(e)

        thread = threading.Thread(target=ask, name="fthsdp-catchup-push", daemon=True)
        thread.start()
        verified, checks = 0, collections.deque[tuple[int, concurrent.futures.Future]]()
        finished = False
        try:
            # Each chunk's digest is checked on a helper thread while the next one arrives.
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fthsdp-crc") as checker:
                try:
                    pieces = chunks_of(data, piece_bytes(size))
                    per = size // piece_bytes(size)  # pieces of a chunk
                    for index in session.receive(pieces):
                        if (index + 1) % per and index + 1 < len(pieces):
                            continue  # the chunk is not complete yet
                        c = index // per
                        checks.append((c, checker.submit(digest, view[c * size : (c + 1) * size])))
                        verified = self._checked(checks, 1, manifest, expected, progress, verified)
                finally:  # what did arrive counts, also when the rest did not
                    verified = self._checked(checks, 0, manifest, expected, progress, verified)
            finished = True
        except (GroupTransferError, _BadChunk) as e:
            self._fall_back(asked[0] if asked else e)
        finally:
            if not finished and self._session is not None:
                self._fall_back(RuntimeError("the transfer was left"))  # a drain: the group is out of step
        thread.join(self._timeout if verified == len(expected) else 1.0)
        return verified

    @staticmethod
    def _checked(checks: collections.deque, keep: int, manifest: cpb.SnapshotManifest, expected: Sequence[int],
                 progress: Callable[[int], None], verified: int) -> int:
        """Take the digest checks' results in order, leaving the newest ``keep`` to run on."""
        while len(checks) > keep:
            index, crc = checks.popleft()
            if crc.result() != expected[index]:
                checks.clear()  # nothing after a bad chunk counts
                raise _BadChunk(f"chunk {index} of the snapshot of step {manifest.step} failed its digest check")
            verified = index + 1
            progress(min(manifest.total_bytes, verified * manifest.chunk_bytes))
        return verified

    def log(self, from_step: int, max_bytes: int = 256 << 20, wait: float = 0.0):
        """Entries from ``from_step`` on: (list of (LogEntry, tensor), head step, oldest step)."""
        session = self._session  # opened by the snapshot's fetch; None: over HTTP
        query = f"from={from_step}&max_bytes={max_bytes}&wait={wait:g}"
        if session is not None:
            query += f"&session={session.name}"
        response = self._request("GET", f"/v1/log?{query}", timeout=wait + self._timeout)
        if response.status == 410:
            raise LogGone(self._body_text(response))
        try:
            if response.status == 404 and session is not None:
                raise GroupTransferError(f"the source closed the session: {self._body_text(response)}")
            if response.status != 200:
                self._body(response, "log")
            (length,) = struct.unpack(">I", response.read(4))
            batch = cpb.LogBatch.FromString(response.read(length))
            out = [(entry, torch.empty(entry.numel, dtype=dtype_from_name(entry.dtype))) for entry in batch.entries]
            raw = [data.view(torch.uint8) for _, data in out]
            if session is not None:
                for _ in session.receive([piece for r in raw for piece in chunks_of(r, LOG_PIECE)]):
                    pass
            for (entry, _), data in zip(out, raw, strict=True):
                view = data.numpy().data.cast("B")
                if session is None:
                    _read_exact(response, view)
                if entry.numel and not entry_intact(entry, view):
                    raise _BadChunk(f"log entry of step {entry.step} failed its digest check")
        except (GroupTransferError, _BadChunk) as e:
            if session is None:
                self._disconnect()
                raise SourceUnavailable(f"catch-up source {self.address}: log: {e}") from e
            self._fall_back(e)
            return self.log(from_step, max_bytes, wait)  # the same entries, over HTTP
        except (OSError, http.client.HTTPException, struct.error) as e:
            self._disconnect()
            raise SourceUnavailable(f"catch-up source {self.address}: log: {e}") from e
        return out, batch.head_step, batch.oldest_step

    def _body_text(self, response) -> str:
        try:
            return response.read().decode(errors="replace").strip()
        except (OSError, http.client.HTTPException) as e:
            self._disconnect()
            return str(e)


class _BadChunk(Exception):
    pass
