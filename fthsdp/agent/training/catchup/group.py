"""A joiner's bulk bytes over a two-rank torch.distributed group (``--catch-up-transport distributed``).

HTTP (fthsdp/agent/training/catchup/server.py) stays the control path of
catch-up: the snapshot request, its manifest, the log's entries and their
CRCs, the release. This module moves the bulk bytes, the snapshot's and the
log's, over the job's own cross-replica transport
(fthsdp/agent/training/transport/): gloo on CPU, NCCL on a GPU, so that a
joiner on a GPU cluster copies at the fabric's speed instead of through
Python's HTTP.

A *session* is one group between one joiner rank and the same rank of its
source, kept for the whole catch-up:

1. The joiner hosts a TCPStore on its advertised host (port 0) and asks the
   source over HTTP to open a session (``POST /v1/sessions`` with the
   store's address, a fresh prefix that names the session, and the backend:
   ``SessionRequest``). The source's handler connects to the store, marks
   itself ready, and both build a two-rank group (source rank 0, joiner
   rank 1) with the transport's own ``build``.
2. The snapshot: the joiner asks the source to push it from the first chunk
   it still needs (``POST /v1/snapshots/<step>/push?session=...``) and
   receives the manifest's chunks (the ones HTTP would serve) into its host
   buffer, CRC-checking each against the manifest.
3. The log: ``GET /v1/log?...&session=...`` answers the entries (with their
   CRCs) over HTTP and sends their bytes over the group; the joiner checks
   each entry's CRC.

A few pieces are in flight on each side; on NCCL each is staged through a
device buffer, and the host buffers stay the ones HTTP serves. Both sides
count the pieces of a session in the same order, which tags them.

fthsdp's rules hold on this path as on HTTP: chunked bytes, every chunk or
entry CRC-checked before it counts, the structure as the manifest's JSON
skeleton and protobuf, nothing pickled. Any failure (the source refuses,
dies, is too slow, a check fails) ends the session, and the joiner goes on
over HTTP from what it has verified (``SourceClient``), so a broken fast
path costs time, never the copy.

The group carries no credential of its own: the session is asked for over
the authenticated HTTP path, and the bytes go unencrypted, like the
cross-replica gradients. With catch-up TLS everything stays on HTTPS. The
source connects only to a store at the address the request came from
(``store_host_problem``), and the request's transfer token binds the
store's address, so no caller can point a source at a third party.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import ipaddress
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport import Transport
from fthsdp.core.errors import FthsdpError

log = logging.getLogger("fthsdp.agent.catchup")

IN_FLIGHT = 4
"""Pieces posted ahead on each side: enough to keep the link busy while a
piece is checked, few enough that NCCL's staging buffers stay small."""

LOG_PIECE = 8 << 20
"""A log entry's bytes travel over a session in pieces of this size (as the snapshot's chunks)."""

TRANSPORTS = ("auto", "http", "distributed")
_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_ADDRESS = re.compile(r"^\[?([^\[\]]+?)\]?:(\d{1,5})$")


class GroupTransferError(FthsdpError):
    """The transfer over the group cannot go on (the joiner goes on over HTTP)."""


@dataclasses.dataclass(frozen=True)
class SessionRequest:
    """What a joiner asks a source for to open a session, as the query of its POST."""

    store: str
    """host:port of the TCPStore the joiner hosts for this session."""

    prefix: str
    """The session's keys in that store; also its name in later requests."""

    backend: str
    """The group's backend (the joiner's transport): gloo or nccl."""

    def query(self) -> str:
        return f"store={self.store}&prefix={self.prefix}&backend={self.backend}"

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> SessionRequest:
        """ValueError for anything malformed (the server answers 400)."""
        try:
            store, prefix, backend = query["store"], query["prefix"], query["backend"]
        except KeyError as e:
            raise ValueError(f"a session needs store, prefix and backend: {e.args[0]} is missing") from e
        if not _ADDRESS.match(store) or not _PREFIX.match(prefix):
            raise ValueError(f"malformed session request: store={store!r} prefix={prefix!r}")
        return cls(store, prefix, backend)


def store_host_problem(store: str, peer: str) -> str:
    """Why a source must not connect to the session store ``store`` for a
    request that came from ``peer`` (the connection's address); '' if it may.

    The source connects only back to whoever asked: the store's host must be
    that address, as an IP literal (a name would need a lookup, whose answer
    the asker may control, to be compared). The joiner arranges it: its
    store and its HTTP connection both use its advertised host, resolved
    once (``numeric_host``). Where the two can still differ (a NAT between
    the replicas, a name that resolves otherwise on the two hosts) the
    session is refused and catch-up goes on over HTTP: slower, never
    pointed at a third party."""
    host = store.rpartition(":")[0].strip("[]")
    try:
        asked, came = _ip(host), _ip(peer)
    except ValueError:
        return f"the store's host must be this request's address {peer}, not {host!r}"
    if asked != came:
        return f"the store's host must be this request's address {peer}, not {host}"
    return ""


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack server sees an IPv4 peer as ::ffff:a.b.c.d
    return address


def numeric_host(host: str) -> str:
    """``host`` as an IP literal (the first address it resolves to; itself
    when it is one, or when it does not resolve: the source then refuses
    sessions, see ``store_host_problem``)."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return host
    return str(infos[0][4][0]) if infos else host


PIECE = 1 << 20
"""A snapshot chunk travels in pieces of this size when it is a multiple of
it: the rate limit paces each piece, as HTTP paces its writes."""


def piece_bytes(chunk_bytes: int) -> int:
    """The pieces a snapshot chunk of ``chunk_bytes`` travels in (both sides compute it)."""
    return PIECE if chunk_bytes % PIECE == 0 else chunk_bytes


def chunks_of(data: torch.Tensor, size: int, first: int = 0) -> list[torch.Tensor]:
    """``data`` (flat uint8) cut into pieces of ``size`` bytes, from piece ``first`` on."""
    return [data[i : i + size] for i in range(first * size, data.numel(), size)]


class Session:
    """One side of a session's group: pieces sent or received in order."""

    def __init__(self, channel: GroupChannel, group, rank: int, name: str, keep: object = None) -> None:
        """``keep``: what must live as long as the session (the joiner's store)."""
        self.channel = channel
        self._keep = keep
        self.name = name
        self._group = group
        self._peer = 1 - rank
        self._tag = 0
        self._staging: list[torch.Tensor] = []
        self.lock = threading.Lock()
        """One transfer at a time (the source's HTTP threads take it)."""
        self.last_used = time.monotonic()
        self.closed = False

    def _stage(self, index: int, size: int) -> torch.Tensor | None:
        """A device buffer for an NCCL piece; None on gloo (the host bytes travel themselves)."""
        device = self.channel.transport.device
        if device.type == "cpu":
            return None
        slot = index % IN_FLIGHT  # free again: the piece IN_FLIGHT before this one is done
        while len(self._staging) <= slot:
            self._staging.append(torch.empty(0, dtype=torch.uint8, device=device))
        if self._staging[slot].numel() < size:
            self._staging[slot] = torch.empty(size, dtype=torch.uint8, device=device)
        return self._staging[slot][:size]

    def _await(self, work, deadline: float) -> None:
        """Wait for one piece up to ``deadline``; never a blind blocking wait:
        NCCL's is polled and the communicator aborted on time out."""
        transport = self.channel.transport
        if transport.name == "gloo":
            left = deadline - time.monotonic()
            if left <= 0 or not work.wait(datetime.timedelta(seconds=left)):
                raise GroupTransferError("timed out")
            return
        pause = threading.Event()
        while not work.is_completed():
            if time.monotonic() > deadline:
                self.close()
                raise GroupTransferError("timed out")
            pause.wait(0.0005)
        work.wait()  # surfaces an error; orders the current stream after the transfer

    def send(self, pieces: list[torch.Tensor], pace: Callable[[int], None] = lambda sent: None) -> None:
        """Send host uint8 ``pieces`` in order; ``pace(bytes_sent)`` before each."""
        with self.channel.on_device(), self._failing("sending"):
            pending: collections.deque = collections.deque()
            sent = 0
            deadline = time.monotonic() + self.channel.timeout
            for i, piece in enumerate(pieces):
                if len(pending) == IN_FLIGHT:
                    self._await(pending.popleft(), deadline)
                    deadline = time.monotonic() + self.channel.timeout  # per piece, not per transfer
                pace(sent)  # before the piece: the bytes before it have had their time
                stage = self._stage(i, piece.numel())
                if stage is not None:
                    stage.copy_(piece, non_blocking=True)
                pending.append(self._group.send([piece if stage is None else stage], self._peer, self._next_tag()))
                sent += piece.numel()
            while pending:
                self._await(pending.popleft(), deadline)
        self.last_used = time.monotonic()

    def receive(self, pieces: list[torch.Tensor]) -> Iterator[int]:
        """Receive into host uint8 ``pieces`` in order, yielding each index as
        its bytes are in host memory (the caller checks them meanwhile)."""
        with self.channel.on_device(), self._failing("receiving"):
            pending: collections.deque = collections.deque()
            posted = 0
            deadline = time.monotonic() + self.channel.timeout
            while posted < len(pieces) or pending:
                while posted < len(pieces) and len(pending) < IN_FLIGHT:
                    target = pieces[posted]
                    stage = self._stage(posted, target.numel())
                    into = target if stage is None else stage
                    pending.append((posted, self._group.recv([into], self._peer, self._next_tag()), into))
                    posted += 1
                index, work, into = pending.popleft()
                self._await(work, deadline)
                deadline = time.monotonic() + self.channel.timeout
                if into is not pieces[index]:
                    pieces[index].copy_(into)  # device to host: the checks and the load read host memory
                yield index
        self.last_used = time.monotonic()

    def _next_tag(self) -> int:
        self._tag += 1
        return self._tag

    @contextlib.contextmanager
    def _failing(self, what: str):
        """A failed transfer ends the session: the two sides' counts of pieces no longer match."""
        if self.closed:
            raise GroupTransferError(f"session {self.name} is closed")
        try:
            yield
        except GroupTransferError:
            self.close()
            raise
        except RuntimeError as e:  # torch's group errors
            self.close()
            raise GroupTransferError(f"{what}: {e}") from e
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the session: NCCL's communicator is aborted; gloo's group is let
        go, which closes its connections (the peer's waits fail at once)."""
        if not self.closed:
            self.closed = True
            if self.channel.transport.name != "gloo":
                self.channel.transport.abort(self._group)  # one communicator per session
            self._group = None


class GroupChannel:
    """How a rank opens sessions (a joiner) and accepts them (a source)."""

    def __init__(self, transport: Transport, host: str, timeout: float) -> None:
        """``transport``: the rank's cross-replica transport (its backend
        and device); ``host``: the address a joiner's store binds."""
        self.transport = transport
        self.host = host
        self.timeout = timeout

    @property
    def name(self) -> str:
        return f"distributed ({self.transport.name})"

    def on_device(self):
        """The transport's GPU as this thread's current device (an HTTP or
        catch-up thread starts on GPU 0, whatever the rank's device is)."""
        if self.transport.device.type == "cuda":
            return torch.cuda.device(self.transport.device)
        return contextlib.nullcontext()

    def _group(self, store: dist.Store, prefix: str, rank: int):
        with self.on_device():
            return self.transport.build(dist.PrefixStore(prefix, store), rank, 2,
                                        datetime.timedelta(seconds=self.timeout))

    def accept(self, request: SessionRequest) -> Session:
        """The source's side of a session a joiner asked for (on an HTTP thread)."""
        if request.backend != self.transport.name:
            raise GroupTransferError(f"this source sends over {self.transport.name}, "
                                     f"the joiner asked for {request.backend}")
        m = _ADDRESS.match(request.store)
        assert m is not None  # SessionRequest.parse checked it
        try:
            store = dist.TCPStore(m.group(1), int(m.group(2)), is_master=False,
                                  timeout=datetime.timedelta(seconds=self.timeout))
            store.set(request.prefix + "/source", "ready")
            group = self._group(store, request.prefix, 0)
        except (RuntimeError, ValueError) as e:  # torch's store and group errors
            raise GroupTransferError(f"could not reach the joiner's store {request.store}: {e}") from e
        return Session(self, group, 0, request.prefix)

    def open(self, ask: Callable[[SessionRequest], None]) -> Session:
        """The joiner's side: host a store, ``ask(request)`` the source to
        open the session (on a thread of its own: it answers once the
        group is built), and build this side meanwhile."""
        timeout = datetime.timedelta(seconds=self.timeout)
        store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        address = f"[{self.host}]:{store.port}" if ":" in self.host else f"{self.host}:{store.port}"
        request = SessionRequest(address, f"catchup-{uuid.uuid4().hex}", self.transport.name)
        asked: dict[str, BaseException | None] = {}

        def run() -> None:
            try:
                ask(request)
                asked["error"] = None
            except BaseException as e:  # reported to this thread below
                asked["error"] = e

        thread = threading.Thread(target=run, name="fthsdp-catchup-session", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.timeout
        while True:  # until the source joined the store, or its answer says it will not
            try:
                store.wait([request.prefix + "/source"], datetime.timedelta(milliseconds=100))
                break
            except RuntimeError as e:  # DistStoreError: not there yet
                if not thread.is_alive() and asked.get("error") is not None:
                    raise GroupTransferError(f"the source refused the session: {asked['error']}") from e
                if time.monotonic() > deadline:
                    raise GroupTransferError("the source did not join within the timeout") from e
        try:
            group = self._group(store, request.prefix, 1)
        except RuntimeError as e:
            raise GroupTransferError(f"building the session's group: {e}") from e
        thread.join(self.timeout)
        if asked.get("error") is not None:
            raise GroupTransferError(f"the source refused the session: {asked['error']}")
        return Session(self, group, 1, request.prefix, keep=store)


SESSION_IDLE = 120.0
"""Seconds a session may go unused before the source closes it (a joiner that died)."""


class OpenSessions:
    """The open sessions of a source, by name (the HTTP threads share them)."""

    def __init__(self) -> None:
        self._open: dict[str, Session] = {}
        self._lock = threading.Lock()

    def add(self, session: Session) -> None:
        with self._lock:
            now = time.monotonic()
            for name, old in list(self._open.items()):
                if old.closed or now - old.last_used > SESSION_IDLE:
                    old.close()
                    del self._open[name]
            self._open[session.name] = session

    def get(self, name: str) -> Session | None:
        with self._lock:
            session = self._open.get(name)
            if session is not None and session.closed:
                del self._open[name]
                return None
            return session

    def close(self, name: str) -> bool:
        with self._lock:
            session = self._open.pop(name, None)
        if session is None:
            return False
        session.close()
        return True

__all__ = [
    "SESSION_IDLE", "OpenSessions",
    "IN_FLIGHT", "LOG_PIECE", "PIECE", "TRANSPORTS", "GroupChannel", "GroupTransferError", "Session",
    "SessionRequest", "chunks_of", "numeric_host", "piece_bytes", "store_host_problem",
]
