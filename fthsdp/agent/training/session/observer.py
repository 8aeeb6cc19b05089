"""A rank other than 0 of a replica group: it follows its replica's place, and pings.

Rank 0 holds the replica's session (fthsdp/agent/training/session/membership.py);
the other ranks of a multi-rank group register nothing. Each follows the
quorum on a Watch stream of its own, naming its replica (the stream keeps
nothing alive), and pings the coordinator as its rank of the group, with the
step and progress its training thread last published, so that a hung or
dead rank is seen as the group's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.session.heartbeat import HeartbeatSender
from fthsdp.agent.training.session.local_pings import LocalPings
from fthsdp.agent.training.session.pushes import Listener, Pushes, WatchFollower, start_thread
from fthsdp.agent.training.session.report import ReplicaReport, Reporting
from fthsdp.client import CoordinatorClient
from fthsdp.core.errors import CoordinatorUnavailable, FthsdpError, RequestRejected
from fthsdp.core.relay_address import ping_phase, through_relay, until_next_ping
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.membership")

LEFT_PING_TIMEOUT = 2.0
"""Seconds a rank other than 0 gives its last ping (it says it left) before it exits anyway."""


class Observer:
    def __init__(self, client: CoordinatorClient, job: str, replica_id: str, shard_rank: int, view: QuorumView,
                 progress: Callable[[], pb.Progress] | None = None, incarnation: str = "") -> None:
        """``progress``: where the training thread is in its step (fthsdp/agent/training/step/clock.py).
        ``incarnation``: the key rank 0 registered this incarnation with, which its pings carry."""
        self.client = client
        self._incarnation = incarnation
        self.job, self.replica_id, self.shard_rank = job, replica_id, shard_rank
        self.view = view
        self.pushes = Pushes(view)
        self.reporting = Reporting()
        """The training thread's report; a ping sends its step."""
        self._progress = progress
        self._beats = HeartbeatSender(client)
        self._stop = threading.Event()
        self._watch = WatchFollower(client, pb.WatchRequest(job=job, replica_id=replica_id), self.pushes.deliver,
                                    self._stop)
        self._threads: list[threading.Thread] = []
        self._local = LocalPings(client, job, replica_id, shard_rank, incarnation)
        """Its liveness for its node agent, under one (fthsdp/agent/training/session/local_pings.py)."""
        self._phase = ping_phase(f"{job}/{replica_id}") if through_relay(client.addresses) else None
        """Under a node agent: where in each interval its pings go, the same for every rank of the group, so
        that its host's relay sends them upstream as one batch (fthsdp/agent/node/relay/pings.py), and the
        group's host 0 its hosts' (fthsdp/agent/node/relay/tree.py); None: every interval from its own start."""

    @property
    def report(self) -> ReplicaReport:
        return self.reporting.current

    def add_listener(self, listener: Listener, before_view: bool = False) -> None:
        self.pushes.add_listener(listener, before_view)

    def start(self) -> None:
        """Follow the quorum and ping, each on a thread of its own."""
        self._threads = [start_thread(self._watch.run, f"fthsdp-observe-{self.replica_id}"),
                         start_thread(self._ping_loop, f"fthsdp-ping-{self.replica_id}")]
        self._local.start()

    def _ping_loop(self) -> None:
        while True:
            request = pb.HeartbeatRequest(job=self.job, replica_id=self.replica_id, shard_rank=self.shard_rank,
                                          step=self.report.step, progress=self._progress() if self._progress else None,
                                          incarnation=self._incarnation)
            try:
                self._beats.send(request)
            except (RequestRejected, CoordinatorUnavailable) as e:
                # Rank 0 may not have registered (again) yet: keep pinging.
                log.debug("rank %d ping: %s", self.shard_rank, e)
            event = self.view.latest
            interval = event.heartbeat_interval_s if event is not None and event.heartbeat_interval_s else 0.5
            if self._phase is not None:
                # The hosts' shared clock (NTP-synced wall time), so that a group's hosts ping together.
                interval = until_next_ping(time.time(), interval, self._phase)
            if self._stop.wait(interval):
                return

    def leave(self, reason: str, failed: bool = False) -> None:
        """The group leaves: a clean leave says so in a last ping (rank 0 tells the reason)."""
        try:
            if not failed:
                self._say_left()
        finally:
            self.close()

    def _say_left(self) -> None:
        """A rank other than 0 whose group leaves cleanly: its last ping says so, so
        that the group is not counted silent while rank 0 finishes (a checkpoint
        share, a seal) before its own Leave."""
        self._stop.set()  # no ping after this one
        request = pb.HeartbeatRequest(job=self.job, replica_id=self.replica_id, shard_rank=self.shard_rank,
                                      step=self.report.step, left=True, incarnation=self._incarnation)
        try:
            self.client.call("Heartbeat", request, timeout=LEFT_PING_TIMEOUT)
        except FthsdpError as e:
            # Rank 0 may have left already (the replica is unknown then), or the coordinator is
            # away: the group is then judged as before, by its silence.
            log.debug("rank %d: could not say it left: %s", self.shard_rank, e)

    def report_reach(self, probe_id: int, reached: list[str], unreached: list[str]) -> None:
        """Answer the coordinator's probe ``probe_id`` for this rank (fthsdp/agent/training/session/reach_probe.py)."""
        self.client.call("ReportReach", pb.ReachReportRequest(
            job=self.job, replica_id=self.replica_id, shard_rank=self.shard_rank, probe_id=probe_id,
            reached=reached, unreached=unreached, incarnation=self._incarnation))

    def close(self) -> None:
        self._stop.set()
        self._local.close()
        self._watch.cancel()
        for t in self._threads:
            t.join(timeout=5)
        self._beats.close()
        self.client.close()


__all__ = ["LEFT_PING_TIMEOUT", "Observer"]
