"""A snapshot's bytes over a two-rank torch.distributed group (``--catch-up-transport distributed``).

HTTP (fthsdp/agent/training/catchup_server.py) stays the control path of
catch-up: the snapshot request, its manifest, the log, the release. This
module moves only the bulk bytes of a snapshot, over the job's own
cross-replica transport (fthsdp/agent/training/transport/): gloo on CPU,
NCCL on a GPU, so that a joiner on a GPU cluster copies at the fabric's
speed instead of through Python's HTTP.

How one transfer goes:

1. The joiner hosts a TCPStore on its advertised host (port 0) and asks the
   source's HTTP server to push: ``POST /v1/snapshots/<step>/push`` with the
   store's address, a fresh prefix, the first chunk it still needs and the
   backend (``PushRequest``). The request runs on a thread of its own; its
   answer says whether the source sent everything.
2. The source's handler connects to that store, marks itself ready, and
   both sides build a two-rank group (source rank 0, joiner rank 1) with the
   transport's own ``build``.
3. The source sends the snapshot's host buffer chunk by chunk (the
   manifest's chunks: the same ones HTTP would serve), a few in flight; on
   NCCL each chunk is staged through a device buffer. The joiner receives
   each into its host buffer and checks its CRC-32 against the manifest.

fthsdp's rules hold on this path as on HTTP: the bytes are chunked and every
chunk is CRC-checked before it counts, and the structure travels as the
manifest's JSON skeleton, never pickled. Any failure (the source refuses,
dies, is too slow, or a chunk fails its check) ends the group, and the
joiner goes on over HTTP from its first unverified chunk
(``SourceClient.fetch``), so a broken fast path costs time, never the copy.

The group carries no credential of its own: the push is asked for over the
authenticated HTTP path, and the bytes go unencrypted, like the
cross-replica gradients. With catch-up TLS the transfer stays on HTTPS.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import logging
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport import Transport
from fthsdp.core.errors import FthsdpError
from fthsdp.protos.v1 import catchup_pb2 as cpb

log = logging.getLogger("fthsdp.agent.catchup")

IN_FLIGHT = 4
"""Chunks posted ahead on each side: enough to keep the link busy while a
chunk is checked, few enough that NCCL's staging buffers stay small."""

TRANSPORTS = ("auto", "http", "distributed")
_PREFIX = re.compile(r"^[A-Za-z0-9/_.-]{1,200}$")
_ADDRESS = re.compile(r"^\[?([^\[\]]+?)\]?:(\d{1,5})$")


class GroupTransferError(FthsdpError):
    """The transfer over the group cannot go on (the joiner falls back to HTTP)."""


@dataclasses.dataclass(frozen=True)
class PushRequest:
    """What a joiner asks a source to push, as the query of its POST."""

    store: str
    """host:port of the TCPStore the joiner hosts for this transfer."""

    prefix: str
    """This transfer's own keys in that store (a fresh group every time)."""

    first_chunk: int
    """The first chunk the joiner still needs."""

    backend: str
    """The group's backend (the joiner's transport): gloo or nccl."""

    def query(self) -> str:
        return f"store={self.store}&prefix={self.prefix}&from={self.first_chunk}&backend={self.backend}"

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> PushRequest:
        """ValueError for anything malformed (the server answers 400)."""
        try:
            store, prefix, first, backend = query["store"], query["prefix"], int(query["from"]), query["backend"]
        except KeyError as e:
            raise ValueError(f"a push needs store, prefix, from and backend: {e.args[0]} is missing") from e
        if not _ADDRESS.match(store) or not _PREFIX.match(prefix) or first < 0:
            raise ValueError(f"malformed push request: store={store!r} prefix={prefix!r} from={first}")
        return cls(store, prefix, first, backend)


def _chunk(data: torch.Tensor, index: int, size: int) -> torch.Tensor:
    return data[index * size : min(data.numel(), (index + 1) * size)]


def _await(work, deadline: float, group, transport: Transport) -> None:
    """Wait for one send or receive up to ``deadline``; never a blind
    blocking wait: NCCL's is polled and its communicator aborted on time out."""
    if transport.name == "gloo":
        left = deadline - time.monotonic()
        if left <= 0 or not work.wait(datetime.timedelta(seconds=left)):
            raise GroupTransferError("timed out")
        return
    pause = threading.Event()
    while not work.is_completed():
        if time.monotonic() > deadline:
            transport.abort(group)
            raise GroupTransferError("timed out")
        pause.wait(0.0005)
    work.wait()  # surfaces an error; orders the current stream after the transfer


def _connect(address: str, timeout: float) -> dist.TCPStore:
    m = _ADDRESS.match(address)
    assert m is not None  # PushRequest.parse checked it
    return dist.TCPStore(m.group(1), int(m.group(2)), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout))


class GroupChannel:
    """Both ends of the transfer for one rank: ``push`` on the source's
    HTTP thread, ``receive`` on the joiner's catching-up thread."""

    def __init__(self, transport: Transport, host: str, timeout: float) -> None:
        """``transport``: the rank's cross-replica transport (its backend
        and device); ``host``: the address the joiner's store binds."""
        self.transport = transport
        self.host = host
        self.timeout = timeout

    @property
    def name(self) -> str:
        return f"distributed ({self.transport.name})"

    def _group(self, store: dist.Store, prefix: str, rank: int):
        return self.transport.build(dist.PrefixStore(prefix, store), rank, 2,
                                    datetime.timedelta(seconds=self.timeout))

    def _on_device(self):
        """The transport's GPU as this thread's current device (an HTTP or
        catch-up thread starts on GPU 0, whatever the rank's device is)."""
        if self.transport.device.type == "cuda":
            return torch.cuda.device(self.transport.device)
        return contextlib.nullcontext()

    def _staging(self, size: int) -> list[torch.Tensor] | None:
        if self.transport.device.type == "cpu":
            return None  # gloo sends and receives the host buffer itself
        return [torch.empty(size, dtype=torch.uint8, device=self.transport.device) for _ in range(IN_FLIGHT)]

    # ----- the source ------------------------------------------------------------------

    def push(self, data: torch.Tensor, chunk_bytes: int, request: PushRequest,
             pace: Callable[[int], None] = lambda sent: None) -> int:
        """Send ``data`` (the snapshot's host buffer) from ``request.first_chunk``
        on; returns the chunks sent. ``pace(bytes_sent)`` before each chunk
        (the server's rate limit). GroupTransferError when it cannot."""
        if request.backend != self.transport.name:
            raise GroupTransferError(f"this source sends over {self.transport.name}, "
                                     f"the joiner asked for {request.backend}")
        with self._on_device():
            return self._push(data, chunk_bytes, request, pace)

    def _push(self, data: torch.Tensor, chunk_bytes: int, request: PushRequest,
              pace: Callable[[int], None]) -> int:
        chunks = (data.numel() + chunk_bytes - 1) // chunk_bytes
        deadline = time.monotonic() + self.timeout
        try:
            store = _connect(request.store, self.timeout)
            store.set(request.prefix + "/source", "ready")
            group = self._group(store, request.prefix, 0)
        except (RuntimeError, ValueError) as e:  # torch's store and group errors
            raise GroupTransferError(f"could not reach the joiner's store {request.store}: {e}") from e
        staging = self._staging(chunk_bytes)
        pending: collections.deque = collections.deque()
        sent = 0
        try:
            for index in range(request.first_chunk, chunks):
                if len(pending) == IN_FLIGHT:
                    _await(pending.popleft(), deadline, group, self.transport)
                pace(sent)  # before the chunk: the bytes before it have had their time
                piece = _chunk(data, index, chunk_bytes)
                if staging is not None:
                    stage = staging[index % IN_FLIGHT][: piece.numel()]
                    stage.copy_(piece, non_blocking=True)
                    piece = stage
                pending.append(group.send([piece], 1, index))
                sent += piece.numel()
                deadline = time.monotonic() + self.timeout  # a deadline per chunk, not per snapshot
            while pending:
                _await(pending.popleft(), deadline, group, self.transport)
        except RuntimeError as e:
            raise GroupTransferError(f"sending to the joiner: {e}") from e
        return chunks - request.first_chunk

    # ----- the joiner ------------------------------------------------------------------

    def receive(self, ask: Callable[[PushRequest], None], manifest: cpb.SnapshotManifest, data: torch.Tensor,
                first: int, progress: Callable[[int], None]) -> int:
        """Receive the snapshot of ``manifest`` into ``data`` from chunk
        ``first`` on; ``ask(request)`` sends the push request to the source
        (on a thread of its own: it answers once the source is done).
        Returns the chunks received and verified, all of them or fewer when
        the transfer broke off (logged; the caller goes on over HTTP). An
        exception from ``progress`` (a drain) ends the transfer and is raised."""
        chunks = len(manifest.chunk_crc32)
        timeout = datetime.timedelta(seconds=self.timeout)
        store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        request = PushRequest(f"{self.host}:{store.port}" if ":" not in self.host else f"[{self.host}]:{store.port}",
                              f"catchup/{manifest.step}/{uuid.uuid4().hex}", first, self.transport.name)
        asked: dict[str, BaseException | None] = {}

        def run() -> None:
            try:
                ask(request)
                asked["error"] = None
            except BaseException as e:  # reported to the receiving thread
                asked["error"] = e

        thread = threading.Thread(target=run, name="fthsdp-catchup-push", daemon=True)
        thread.start()
        verified = [first]
        group = None
        try:
            self._wait_for_source(store, request.prefix, thread, asked)
            with self._on_device():
                group = self._group(store, request.prefix, 1)
                self._receive_chunks(group, manifest, data, verified, progress)
        except (GroupTransferError, RuntimeError) as e:  # RuntimeError: torch's group errors
            log.warning("catch-up over %s broke off at chunk %d of %d (%s); going on over HTTP",
                        self.name, verified[0], chunks, e)
        finally:
            if group is not None and self.transport.name != "gloo":
                self.transport.abort(group)  # one communicator per transfer
        if verified[0] == chunks:
            thread.join(self.timeout)  # the source's answer: it is done with the group
        return verified[0]

    def _wait_for_source(self, store: dist.TCPStore, prefix: str, thread: threading.Thread,
                         asked: dict[str, BaseException | None]) -> None:
        """Until the source joined the store, or its push request failed."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                store.wait([prefix + "/source"], datetime.timedelta(milliseconds=100))
                return
            except RuntimeError as e:  # DistStoreError: not there yet
                if not thread.is_alive() and asked.get("error") is not None:
                    raise GroupTransferError(f"the source refused the push: {asked['error']}") from e
                if time.monotonic() > deadline:
                    raise GroupTransferError("the source did not join within the timeout") from e

    def _receive_chunks(self, group, manifest: cpb.SnapshotManifest, data: torch.Tensor, verified: list[int],
                        progress: Callable[[int], None]) -> None:
        """``verified[0]``: the chunks received and checked so far, kept up to date."""
        size, total = manifest.chunk_bytes, manifest.total_bytes
        chunks = len(manifest.chunk_crc32)
        staging = self._staging(size)
        pending: collections.deque = collections.deque()
        posted = verified[0]
        deadline = time.monotonic() + self.timeout
        view = data.numpy().data.cast("B")
        # A chunk's CRC is checked on a helper thread while the next arrives.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fthsdp-crc") as checker:
            checks: collections.deque = collections.deque()
            while verified[0] < chunks:
                while posted < chunks and len(pending) < IN_FLIGHT:
                    target = _chunk(data, posted, size)
                    into = target if staging is None else staging[posted % IN_FLIGHT][: target.numel()]
                    pending.append((posted, group.recv([into], 0, posted), target, into))
                    posted += 1
                if pending:
                    index, work, target, into = pending.popleft()
                    try:
                        _await(work, deadline, group, self.transport)
                    except (GroupTransferError, RuntimeError):
                        self._check(checks, manifest, verified, progress, keep=0)  # what did arrive counts
                        raise
                    if into is not target:
                        target.copy_(into)  # device to host: the CRC and the load read the host buffer
                    piece = view[index * size : min(total, (index + 1) * size)]
                    checks.append((index, checker.submit(zlib.crc32, piece)))
                    deadline = time.monotonic() + self.timeout
                self._check(checks, manifest, verified, progress, keep=1 if pending else 0)

    @staticmethod
    def _check(checks: collections.deque, manifest: cpb.SnapshotManifest, verified: list[int],
               progress: Callable[[int], None], keep: int) -> None:
        """Take the CRC results in order, leaving the newest ``keep`` to run
        on while the next chunk arrives."""
        while len(checks) > keep:
            index, crc = checks.popleft()
            if crc.result() != manifest.chunk_crc32[index]:
                raise GroupTransferError(f"chunk {index} of the snapshot of step {manifest.step} "
                                         "failed its CRC check")
            verified[0] = index + 1
            progress(min(manifest.total_bytes, verified[0] * manifest.chunk_bytes))


__all__ = ["IN_FLIGHT", "TRANSPORTS", "GroupChannel", "GroupTransferError", "PushRequest"]
