"""Keep one replica group registered with the coordinator.

``Membership`` registers the replica, heartbeats on a background thread, and
holds one Watch stream open on another, so the training loop reads the latest
quorum from memory (``latest``) and never calls the coordinator on a step
where nothing changed. When the coordinator restarts or another one takes
over, the session is re-established with the quorum id the replica still
trains in, so it keeps its place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from agent.heartbeat_sender import HeartbeatSender
from coordinator import quorum_delta
from coordinator.client import CoordinatorClient
from coordinator.credentials import TlsFiles
from coordinator.errors import CoordinatorUnavailable, RequestRejected
from protos.fthsdp.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.membership")

_REREGISTER = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


class Membership:
    def __init__(
        self,
        coordinators: Sequence[str],
        job: str,
        replica_id: str,
        address: str,
        world_size: int = 1,
        step: int = 0,
        timeout: float = 5.0,
        token: str = "",
        tls: TlsFiles | None = None,
        member_list: bool = False,
    ) -> None:
        """``member_list``: also be sent the quorum's member list (tools and
        tests that show it; a replica trains with its place alone)."""
        self.client = CoordinatorClient(coordinators, timeout=timeout, token=token, tls=tls)
        self._beats = HeartbeatSender(self.client)
        self.job = job
        self.replica_id = replica_id
        self.address = address
        self.world_size = world_size
        self.step = step
        self.ready = False
        self.catching_up = False
        self.state_checksum = ""
        self.checksum_step = 0
        self.recent_checksums: dict[int, str] = {}
        """Checksums at earlier steps, sent with each heartbeat (see the proto)."""
        self.catch_up_addresses: list[str] = []
        """This replica's catch-up servers, one per shard rank, sent when registering."""
        self.catch_up_progress: tuple[int, int] = (0, 0)
        """Snapshot bytes received and expected while catching up."""
        self._beat_now = threading.Event()
        self.training_quorum_id = 0
        """The quorum this process trains in; sent when it re-registers."""
        self.latest: pb.WatchEvent | None = None
        self._session = ""
        self._interval = 1.0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stream = None
        self._register_lock = threading.Lock()
        self._observer = False
        self._member_list = member_list
        self._listeners: list[Callable[[pb.WatchEvent], None]] = []

    # ----- lifecycle -----------------------------------------------------------------

    def observe(self, shard_rank: int) -> None:
        """Follow the quorum without registering, and ping the coordinator as
        rank ``shard_rank`` of the replica group. The other ranks of a
        multi-rank group do this; its rank 0 holds the replica's session."""
        self._observer = True
        self.shard_rank = shard_rank
        for target, name in ((self._watch_loop, "observe"), (self._ping_loop, "ping")):
            t = threading.Thread(target=target, name=f"fthsdp-{name}-{self.replica_id}", daemon=True)
            t.start()
            self._threads.append(t)

    def _ping_loop(self) -> None:
        while True:
            request = pb.HeartbeatRequest(job=self.job, replica_id=self.replica_id, shard_rank=self.shard_rank)
            try:
                self._beats.send(request)
            except (RequestRejected, CoordinatorUnavailable) as e:
                # Rank 0 may not have registered (again) yet: keep pinging.
                log.debug("rank %d ping: %s", self.shard_rank, e)
            event = self.latest
            interval = event.heartbeat_interval_s if event is not None and event.heartbeat_interval_s else 0.5
            if self._stop.wait(interval):
                return

    def start(self, deadline: float = 30.0) -> None:
        """Register (retrying until ``deadline`` seconds pass) and start the threads."""
        end = time.monotonic() + deadline
        while True:
            try:
                self._register()
                break
            except CoordinatorUnavailable:
                if time.monotonic() > end:
                    raise
                self._stop.wait(0.2)
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._watch_loop, "watch")):
            t = threading.Thread(target=target, name=f"fthsdp-{name}-{self.replica_id}", daemon=True)
            t.start()
            self._threads.append(t)

    def leave(self, reason: str, failed: bool = False) -> None:
        if self._observer:
            self.close()
            return
        try:
            self.client.call(
                "Leave",
                pb.LeaveRequest(
                    job=self.job, replica_id=self.replica_id, session_id=self._session, reason=reason, failed=failed
                ),
            )
        finally:
            self.close()

    def set_catching_up(self, catching_up: bool) -> None:
        """Say (at once) that a catch-up is under way: the coordinator then
        waits for ``set_ready`` before admitting this replica, whatever its
        step (a replay may bring it level with the members' last heartbeats)."""
        if self.catching_up != catching_up:
            self.catching_up = catching_up
            self._beat_now.set()

    def set_ready(self, ready: bool) -> None:
        """Say (at once, not at the next heartbeat) whether this replica, not
        a member, can join at the next step boundary."""
        if self.ready != ready:
            self.ready = ready
            self._beat_now.set()

    def close(self) -> None:
        self._stop.set()
        self._beat_now.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        for t in self._threads:
            t.join(timeout=5)
        self._beats.close()
        self.client.close()

    # ----- reading ---------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[pb.WatchEvent], bool], timeout: float) -> pb.WatchEvent:
        """Block until the latest event satisfies ``predicate``; TimeoutError after ``timeout``."""
        end = time.monotonic() + timeout
        with self._cond:
            while self.latest is None or not predicate(self.latest):
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching coordinator event within {timeout}s; latest: {self.latest}")
                self._cond.wait(left)
            return self.latest

    def is_member(self, event: pb.WatchEvent | None = None) -> bool:
        event = event or self.latest
        return event is not None and event.HasField("place")

    # ----- internals -------------------------------------------------------------------

    def _register(self) -> None:
        response = self.client.call(
            "Register",
            pb.RegisterRequest(
                job=self.job,
                replica_id=self.replica_id,
                address=self.address,
                world_size=self.world_size,
                step=self.step,
                quorum_id=self.training_quorum_id,
                catch_up_addresses=self.catch_up_addresses,
            ),
        )
        self._session = response.session_id
        self._interval = response.heartbeat_interval_s or 1.0

    def _heartbeat_loop(self) -> None:
        while True:
            # The coordinator may stretch the interval (many replicas): the
            # latest Watch event says what it is now.
            event = self.latest
            self._beat_now.wait(event.heartbeat_interval_s if event is not None and event.heartbeat_interval_s else self._interval)
            if self._stop.is_set():
                return
            self._beat_now.clear()
            done, total = self.catch_up_progress
            request = pb.HeartbeatRequest(
                job=self.job,
                replica_id=self.replica_id,
                session_id=self._session,
                step=self.step,
                ready=self.ready,
                state_checksum=self.state_checksum,
                checksum_step=self.checksum_step,
                recent_checksums=[pb.StepChecksum(step=s, checksum=c) for s, c in list(self.recent_checksums.items())],
                catch_up_bytes=done,
                catch_up_total_bytes=total,
                catching_up=self.catching_up,
            )
            try:
                self._beats.send(request)
            except RequestRejected as e:
                if e.code in _REREGISTER:
                    self._reregister(str(e), request.session_id)
                else:
                    log.warning("heartbeat rejected: %s", e)
            except CoordinatorUnavailable as e:
                log.warning("heartbeat: %s", e)

    def _reregister(self, why: str, stale_session: str) -> None:
        """Register again unless the other thread already did since ``stale_session``."""
        with self._register_lock:
            if self._session != stale_session:
                return
            log.info("registering again (%s)", why)
            try:
                self._register()
            except (CoordinatorUnavailable, RequestRejected) as e:
                log.warning("registration failed: %s", e)
                return
        # The open Watch stream belongs to the old session: reopen it.
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            address = self.client.current_address()
            # An observer (another rank of the group) names the replica for
            # its place, without the session: its stream keeps nothing alive.
            session = "" if self._observer else self._session
            request = pb.WatchRequest(job=self.job, replica_id=self.replica_id, session_id=session,
                                      member_list=self._member_list)
            held = None  # the full quorum this stream last described
            try:
                self._stream = self.client.stub(address).Watch(request, metadata=self.client.metadata)
                for event in self._stream:
                    held = quorum_delta.resolve(held, event)
                    if event.HasField("delta"):
                        event.quorum.CopyFrom(held)
                        event.ClearField("delta")
                    self._deliver(event)
            except quorum_delta.StaleDelta as e:
                log.warning("watch: %s; reopening the stream", e)
                self._stream.cancel()
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                code = e.code()
                if code in _REREGISTER:
                    self._reregister(e.details() or code.name, request.session_id)
                elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self.client.advance()
                elif code == grpc.StatusCode.CANCELLED:
                    pass  # we cancelled it to reopen with a new session
                else:
                    log.warning("watch stream ended: %s %s", code.name, e.details())
            # Back off a little so a coordinator that is down is not hammered.
            self._stop.wait(0.1)

    def add_listener(self, listener: Callable[[pb.WatchEvent], None]) -> None:
        """Call ``listener(event)`` on the watch thread for every event (keep it quick)."""
        self._listeners.append(listener)

    def _deliver(self, event: pb.WatchEvent) -> None:
        with self._cond:
            self.latest = event
            self._cond.notify_all()
        for listener in self._listeners:
            listener(event)
