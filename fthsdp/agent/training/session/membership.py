"""Keep one replica group registered with the coordinator.

``Membership`` registers the replica on one Session call
(fthsdp/agent/training/session/client.py), heartbeats on it from a background thread and
reads the coordinator's pushes from it on another into a ``QuorumView``
(fthsdp/agent/training/quorum_view.py), so the training loop reads the
latest quorum from memory and never calls the
coordinator on a step where nothing changed. When the session ends (the
coordinator restarted, another one took over, or it refused a heartbeat),
the replica registers on a new one with the quorum id it still trains in,
so it keeps its place. The other ranks of a group only observe
(fthsdp/agent/training/session/observer.py). What the heartbeats say is the
report the training thread (and the checkpoint saver's) last published
whole (fthsdp/agent/training/session/report.py): this module only sends it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.session.client import SessionCall, open_session
from fthsdp.agent.training.session.lease import MemberLease
from fthsdp.agent.training.session.local_pings import LocalPings
from fthsdp.agent.training.session.pushes import Listener, Pushes, WatchFollower, start_thread
from fthsdp.agent.training.session.report import ReplicaReport, Reporting
from fthsdp.client import CoordinatorClient
from fthsdp.core.credentials import TlsFiles
from fthsdp.core.errors import CoordinatorUnavailable, RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.membership")


class Membership:
    """Rank 0 of a replica group: the replica's session with the coordinator."""

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
        view: QuorumView | None = None,
        catch_up_addresses: Sequence[str] = (),
        restart_count: int = 0,
        progress: Callable[[], pb.Progress] | None = None,
        agent_ids: Sequence[str] = (),
        incarnation: str = "",
        catch_up_fingerprints: Sequence[str] = (),
    ) -> None:
        """``member_list``: also be sent the quorum's member list (tools and
        tests that show it; a replica trains with its place alone). ``view``:
        where the pushes go (fthsdp/agent/training/quorum_view.py; a new one by
        default). ``catch_up_addresses``: this replica's catch-up servers, one
        per shard rank, sent when registering. ``restart_count``: this process's
        incarnation (FTHSDP_RESTART_COUNT). ``progress``: where the training
        thread is in its step (fthsdp/agent/training/step/clock.py), sent with every heartbeat.
        ``agent_ids``: the node agents that started the group's processes (FTHSDP_AGENT_ID), sent when registering.
        ``incarnation``: the key this incarnation's other ranks ping with (RegisterRequest.incarnation).
        ``catch_up_fingerprints``: their certificates' fingerprints beside ``catch_up_addresses`` (pinned TLS)."""
        self.client = CoordinatorClient(coordinators, timeout=timeout, token=token, tls=tls)
        self.job = job
        self.replica_id = replica_id
        self.address = address
        self.world_size = world_size
        self.view = view if view is not None else QuorumView(replica_id)
        """The pushes, as every other thread reads them (one copy, written on the session's thread)."""
        self.pushes = Pushes(self.view)
        self.reporting = Reporting(step)
        """What the heartbeats say, published whole by the threads that own it."""
        self.lease = MemberLease(replica_id)
        """Whether this replica may commit: renewed by the answers to its heartbeats."""
        self._lease_quorum = 0
        """The newest quorum id a heartbeat was sent for at once (``_on_push``)."""
        self.pushes.add_listener(self._on_push)
        self._catch_up_addresses = list(catch_up_addresses)
        self._catch_up_fingerprints = list(catch_up_fingerprints)
        self._restart_count = restart_count
        self._agent_ids = sorted(set(agent_ids) - {""})
        self._incarnation = incarnation
        self._progress = progress
        self._session = ""
        self._interval = 1.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._call: SessionCall | None = None
        """The Session of this incarnation."""
        self._member_list = member_list
        self._local = LocalPings(self.client, job, replica_id, 0, incarnation)
        """Its liveness for its node agent, under one (fthsdp/agent/training/session/local_pings.py)."""
        self._watch = WatchFollower(self.client, pb.WatchRequest(job=job, replica_id=replica_id, member_list=True),
                                    self.pushes.deliver, self._stop) if member_list else None
        """A tool's view: the member list, on a Watch stream of its own."""

    # ----- reading ---------------------------------------------------------------------

    @property
    def report(self) -> ReplicaReport:
        """What the next heartbeat says."""
        return self.reporting.current

    @property
    def latest(self) -> pb.WatchEvent | None:
        """The last push (``view.latest``)."""
        return self.view.latest

    def is_member(self, event: pb.WatchEvent | None = None) -> bool:
        return self.view.is_member(event)

    def add_listener(self, listener: Listener, before_view: bool = False) -> None:
        self.pushes.add_listener(listener, before_view)

    # ----- lifecycle -----------------------------------------------------------------

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
        self._threads = [start_thread(self._heartbeat_loop, f"fthsdp-heartbeat-{self.replica_id}"),
                         start_thread(self._session_loop, f"fthsdp-session-{self.replica_id}")]
        self._local.start()
        if self._watch is not None:
            self._threads.append(start_thread(self._watch.run, f"fthsdp-members-{self.replica_id}"))

    def leave(self, reason: str, failed: bool = False) -> None:
        try:
            self.client.call(
                "Leave",
                pb.LeaveRequest(
                    job=self.job, replica_id=self.replica_id, session_id=self._session, reason=reason, failed=failed,
                    step=self.report.step,
                ),
            )
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        self._local.close()
        self.reporting.beat_now.set()
        if self._call is not None:
            self._call.close()
        if self._watch is not None:
            self._watch.cancel()
        for t in self._threads:
            t.join(timeout=5)
        self.client.close()

    def report_reach(self, probe_id: int, reached: list[str], unreached: list[str]) -> None:
        """Answer the coordinator's probe ``probe_id`` for this rank (fthsdp/agent/training/session/reach_probe.py)."""
        self.client.call("ReportReach", pb.ReachReportRequest(
            job=self.job, replica_id=self.replica_id, session_id=self._session,
            shard_rank=0, probe_id=probe_id, reached=reached, unreached=unreached))

    # ----- internals -------------------------------------------------------------------

    def _open(self) -> None:
        """Register this incarnation on a new Session (fthsdp/agent/training/session/client.py)."""
        report = self.report
        register = pb.RegisterRequest(
            job=self.job,
            replica_id=self.replica_id,
            address=self.address,
            world_size=self.world_size,
            step=report.step,
            quorum_id=report.training_quorum_id,
            catch_up_addresses=self._catch_up_addresses,
            catch_up_fingerprints=self._catch_up_fingerprints,
            restart_count=self._restart_count,
            wait_for_replicas=report.wait_for_replicas,
            agent_ids=self._agent_ids,
            incarnation=self._incarnation,
        )
        call = open_session(self.client, register)
        self._call, self._session = call, call.session_id
        self._interval = call.registered.heartbeat_interval_s or 1.0
        self.reporting.beat_now.set()  # the coordinator admits no replica before its first heartbeat

    def _heartbeat_loop(self) -> None:
        beat_now = self.reporting.beat_now
        while True:
            # The coordinator may stretch the interval (many replicas): the
            # latest Watch event says what it is now.
            event = self.view.latest
            beat_now.wait(
                event.heartbeat_interval_s if event is not None and event.heartbeat_interval_s else self._interval
            )
            if self._stop.is_set():
                return
            beat_now.clear()
            self.lease.watch()
            call = self._call
            if call is None:
                continue  # between sessions: registering again is a sign of life too
            r = self.report  # one published value: its fields belong together
            done, total = r.catch_up_progress
            call.heartbeat(pb.HeartbeatRequest(
                ack=True,
                lease_seq=self.lease.sending(),
                step=r.step,
                ready=r.ready,
                state_checksum=r.state_checksum,
                checksum_step=r.checksum_step,
                recent_checksums=r.recent(),
                catch_up_bytes=done,
                catch_up_total_bytes=total,
                catching_up=r.catching_up,
                progress=self._progress() if self._progress else None,
                checkpoint=r.checkpoint,
                refused_checkpoint=r.refused_checkpoint[0],
                refused_checkpoint_reason=r.refused_checkpoint[1],
                wait_for_replicas=r.wait_for_replicas,
            ))

    def _on_ack(self, ack: pb.HeartbeatResponse) -> None:
        self.lease.answered(ack.lease_seq, ack.lease_s)

    def _on_push(self, event: pb.WatchEvent) -> None:
        """Admitted to a new quorum without a lease: heartbeat at once, so that
        its lease comes before its first commit (fthsdp/agent/training/session/lease.py).
        Members that hold one wait for their next beat: a quorum change at
        10,000 replicas is no burst of heartbeats."""
        if event.quorum.id > self._lease_quorum and event.HasField("place"):
            self._lease_quorum = event.quorum.id
            if not self.lease.valid():
                self.reporting.beat_now.set()

    def _session_loop(self) -> None:
        """Deliver the session's events; when it ends, register again on a new
        one (the next coordinator if this one is gone), with the quorum id
        this process still trains in, so that it keeps its place."""
        while not self._stop.is_set():
            call = self._call
            assert call is not None  # start() opened it; the loop below opens the next before going round
            for event in call.events(self._on_ack):
                if not self._member_list:  # else the list's Watch stream delivers (start())
                    self.pushes.deliver(event)
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


__all__ = ["Membership"]
