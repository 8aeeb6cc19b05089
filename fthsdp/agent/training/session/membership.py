"""Keep one replica group registered with the coordinator.

``Membership`` registers the replica on one Session call
(fthsdp/agent/training/session/client.py), heartbeats on it from a background thread and
reads the coordinator's pushes from it on another, so the training loop
reads the latest quorum from memory (``latest``) and never calls the
coordinator on a step where nothing changed. When the session ends (the
coordinator restarted, another one took over, or it refused a heartbeat),
the replica registers on a new one with the quorum id it still trains in,
so it keeps its place. The other ranks of a group only observe: a Watch
stream for their place and a liveness ping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from fthsdp.agent.training.session.client import SessionCall, WatchStream, open_session
from fthsdp.agent.training.session.heartbeat import HeartbeatSender
from fthsdp.client import CoordinatorClient
from fthsdp.core import quorum_delta
from fthsdp.core.credentials import TlsFiles
from fthsdp.core.errors import CoordinatorUnavailable, FthsdpError, RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.membership")

LEFT_PING_TIMEOUT = 2.0
"""Seconds a rank other than 0 gives its last ping (it says it left) before it exits anyway."""


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
        self.shard_rank = 0
        """The rank of the replica group this process is (``observe`` sets it for the others)."""
        self.ready = False
        self.catching_up = False
        self.wait_for_replicas = 0
        """The replica count the script waits for in ``start()`` (0 before it):
        while its quorum has fewer, members wait at their step, so the
        coordinator may vouch for an outsider at that step (see the proto)."""
        self.state_checksum = ""
        self.checksum_step = 0
        self.recent_checksums: dict[int, str] = {}
        """Checksums at earlier steps, sent with each heartbeat (see the proto);
        an ``fthsdp.agent.training.state.checksum.RecentChecksums`` also carries each one's step inputs."""
        self.catch_up_addresses: list[str] = []
        """This replica's catch-up servers, one per shard rank, sent when registering."""
        self.catch_up_progress: tuple[int, int] = (0, 0)
        """Snapshot bytes received and expected while catching up."""
        self.progress: Callable[[], pb.Progress] | None = None
        """Where the training thread is in its step (fthsdp/agent/training/step/clock.py), sent with every heartbeat."""
        self.checkpoint: pb.CheckpointRecord | None = None
        """The newest checkpoint this replica sealed, sent with every heartbeat
        (the coordinator records it: fthsdp/coordinator/checkpoints.py). Set from the saver's thread."""
        self.refused_checkpoint: tuple[str, str] = ("", "")
        """(digest, why) of the last checkpoint this replica could not restore."""
        self.restart_count = 0
        """This process's incarnation (FTHSDP_RESTART_COUNT), sent when registering."""
        self._beat_now = threading.Event()
        self.training_quorum_id = 0
        """The quorum this process trains in; sent when it re-registers."""
        self.latest: pb.WatchEvent | None = None
        self._session = ""
        self._interval = 1.0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._call: SessionCall | None = None
        """The Session of this incarnation (rank 0)."""
        self._watch: WatchStream | None = None
        """A Watch stream: another rank's, or a tool's that shows the member list."""
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
            request = pb.HeartbeatRequest(job=self.job, replica_id=self.replica_id, shard_rank=self.shard_rank,
                                          step=self.step, progress=self.progress() if self.progress else None)
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
        """Register on a Session (retrying until ``deadline`` seconds pass) and start the threads."""
        end = time.monotonic() + deadline
        while True:
            try:
                self._open()
                break
            except CoordinatorUnavailable:
                if time.monotonic() > end:
                    raise
                self._stop.wait(0.2)
        loops = [(self._heartbeat_loop, "heartbeat"), (self._session_loop, "session")]
        if self._member_list:
            loops.append((self._watch_loop, "members"))  # a tool's view: the list, on a Watch of its own
        for target, name in loops:
            t = threading.Thread(target=target, name=f"fthsdp-{name}-{self.replica_id}", daemon=True)
            t.start()
            self._threads.append(t)

    def leave(self, reason: str, failed: bool = False) -> None:
        if self._observer:
            try:
                if not failed:
                    self._say_left()
            finally:
                self.close()
            return
        try:
            self.client.call(
                "Leave",
                pb.LeaveRequest(
                    job=self.job, replica_id=self.replica_id, session_id=self._session, reason=reason, failed=failed,
                    step=self.step,
                ),
            )
        finally:
            self.close()

    def _say_left(self) -> None:
        """A rank other than 0 whose group leaves cleanly: its last ping says so, so
        that the group is not counted silent while rank 0 finishes (a checkpoint
        share, a seal) before its own Leave."""
        self._stop.set()  # no ping after this one
        request = pb.HeartbeatRequest(job=self.job, replica_id=self.replica_id, shard_rank=self.shard_rank,
                                      step=self.step, left=True)
        try:
            self.client.call("Heartbeat", request, timeout=LEFT_PING_TIMEOUT)
        except FthsdpError as e:
            # Rank 0 may have left already (the replica is unknown then), or the coordinator is
            # away: the group is then judged as before, by its silence.
            log.debug("rank %d: could not say it left: %s", self.shard_rank, e)

    def set_catching_up(self, catching_up: bool) -> None:
        """Say (at once) that a catch-up is under way: the coordinator then
        waits for ``set_ready`` before admitting this replica, whatever its
        step (a replay may bring it level with the members' last heartbeats)."""
        if self.catching_up != catching_up:
            self.catching_up = catching_up
            self._beat_now.set()

    def set_wait_for_replicas(self, count: int) -> None:
        """Say (at once) how many replicas the script waits for before its first step."""
        if self.wait_for_replicas != count:
            self.wait_for_replicas = count
            self._beat_now.set()

    def set_ready(self, ready: bool) -> None:
        """Say (at once, not at the next heartbeat) whether this replica, not
        a member, can join at the next step boundary."""
        if self.ready != ready:
            self.ready = ready
            self._beat_now.set()

    def refuse_checkpoint(self, digest: str, reason: str) -> None:
        """A checkpoint this replica could not restore: on the next heartbeat, sent at once."""
        self.refused_checkpoint = (digest, reason)
        self._beat_now.set()

    def report_checkpoint(self, record: pb.CheckpointRecord) -> None:
        """A checkpoint this replica sealed: on the next heartbeat, sent at once."""
        self.checkpoint = record
        self._beat_now.set()

    def close(self) -> None:
        self._stop.set()
        self._beat_now.set()
        if self._call is not None:
            self._call.close()
        if self._watch is not None:
            self._watch.cancel()
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

    def _open(self) -> None:
        """Register this incarnation on a new Session (fthsdp/agent/training/session/client.py)."""
        register = pb.RegisterRequest(
            job=self.job,
            replica_id=self.replica_id,
            address=self.address,
            world_size=self.world_size,
            step=self.step,
            quorum_id=self.training_quorum_id,
            catch_up_addresses=self.catch_up_addresses,
            restart_count=self.restart_count,
            wait_for_replicas=self.wait_for_replicas,
        )
        call = open_session(self.client, register)
        self._call, self._session = call, call.session_id
        self._interval = call.registered.heartbeat_interval_s or 1.0
        self._beat_now.set()  # the coordinator admits no replica before its first heartbeat

    def _heartbeat_loop(self) -> None:
        while True:
            # The coordinator may stretch the interval (many replicas): the
            # latest Watch event says what it is now.
            event = self.latest
            self._beat_now.wait(
                event.heartbeat_interval_s if event is not None and event.heartbeat_interval_s else self._interval
            )
            if self._stop.is_set():
                return
            self._beat_now.clear()
            done, total = self.catch_up_progress
            call = self._call
            if call is None:
                continue  # between sessions: registering again is a sign of life too
            call.heartbeat(pb.HeartbeatRequest(
                step=self.step,
                ready=self.ready,
                state_checksum=self.state_checksum,
                checksum_step=self.checksum_step,
                recent_checksums=self._recent(),
                catch_up_bytes=done,
                catch_up_total_bytes=total,
                catching_up=self.catching_up,
                progress=self.progress() if self.progress else None,
                checkpoint=self.checkpoint,
                refused_checkpoint=self.refused_checkpoint[0],
                refused_checkpoint_reason=self.refused_checkpoint[1],
                wait_for_replicas=self.wait_for_replicas,
            ))

    def _recent(self) -> list[pb.StepChecksum]:
        """The recent checksums to report, each with the inputs of the step
        that produced it when known (fthsdp/agent/training/state/checksum.py's ``RecentChecksums``)."""
        recent = self.recent_checksums
        inputs = getattr(recent, "inputs", {})
        return [pb.StepChecksum(step=s, checksum=c, inputs=inputs.get(s, "")) for s, c in list(recent.items())]

    def _session_loop(self) -> None:
        """Deliver the session's events; when it ends, register again on a new
        one (the next coordinator if this one is gone), with the quorum id
        this process still trains in, so that it keeps its place."""
        while not self._stop.is_set():
            call = self._call
            assert call is not None  # start() opened it; the loop below opens the next before going round
            for event in call.events():
                if not self._member_list:  # else the list's Watch stream delivers (start())
                    self._deliver(event)
            if self._stop.is_set():
                return
            why = call.ended()
            if isinstance(why, CoordinatorUnavailable):
                self.client.advance()
            log.info("session ended (%s); registering again", why or "closed")
            self._call = None
            while not self._stop.is_set():
                try:
                    self._open()
                    break
                except (CoordinatorUnavailable, RequestRejected) as e:
                    log.warning("registration failed: %s", e)
                    self._stop.wait(0.5)

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            address = self.client.current_address()
            # Another rank of the group names the replica for its place,
            # without the session: its stream keeps nothing alive.
            request = pb.WatchRequest(job=self.job, replica_id=self.replica_id, member_list=self._member_list)
            held = None  # the full quorum this stream last described
            try:
                self._watch = self.client.stub(address).Watch(request, metadata=self.client.metadata)
                for event in self._watch:
                    held = quorum_delta.resolve(held, event)
                    if event.HasField("delta"):
                        event.quorum.CopyFrom(held)
                        event.ClearField("delta")
                    self._deliver(event)
            except quorum_delta.StaleDelta as e:
                log.warning("watch: %s; reopening the stream", e)
                assert self._watch is not None  # its events raised it
                self._watch.cancel()
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                code = e.code()
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self.client.advance()
                elif code != grpc.StatusCode.CANCELLED:
                    log.warning("watch stream ended: %s %s", code.name, e.details())
            # Back off a little so a coordinator that is down is not hammered.
            self._stop.wait(0.1)

    def report_reach(self, probe_id: int, reached: list[str], unreached: list[str]) -> None:
        """Answer the coordinator's probe ``probe_id`` for this rank (fthsdp/agent/training/session/reach_probe.py)."""
        self.client.call("ReportReach", pb.ReachReportRequest(
            job=self.job, replica_id=self.replica_id, session_id=self._session,
            shard_rank=self.shard_rank, probe_id=probe_id, reached=reached, unreached=unreached))

    def add_listener(self, listener: Callable[[pb.WatchEvent], None]) -> None:
        """Call ``listener(event)`` on the watch thread for every event (keep it quick)."""
        self._listeners.append(listener)

    def _deliver(self, event: pb.WatchEvent) -> None:
        with self._cond:
            self.latest = event
            self._cond.notify_all()
        for listener in self._listeners:
            listener(event)
