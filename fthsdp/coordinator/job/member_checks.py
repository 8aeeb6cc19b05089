"""The checks that take members out of a job's quorum, run before each decision.

A member whose state checksum disagrees with the others'
(fthsdp/coordinator/job/checksum_vote.py), one that made no progress while the
others waited for it or a straggler (fthsdp/coordinator/decisions/hang.py), and a
stuck collective among healthy members, mended by regrouping, probing and
taking out what cannot be reached (fthsdp/coordinator/decisions/stuck.py; the probes'
answers, ``reach_report``, let such a replica back). Each marks the replicas
it judges on their ``ReplicaEntry`` and makes the next decision due at once;
that decision (fthsdp/coordinator/job/state.py) drops them. Apart from the decisions because
each check has its own schedule (the decision loop runs them every tick,
before it asks whether to decide) and its own module of rules: this is
where those rules meet the table.
"""

from __future__ import annotations

import logging

from fthsdp.coordinator.decisions.stuck import Act
from fthsdp.coordinator.job import checksum_vote
from fthsdp.coordinator.job.table import JobTable
from fthsdp.core.errors import InvalidRequest
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")


class MemberChecks(JobTable):
    """The checks of ``JobState`` (fthsdp/coordinator/job/state.py) that take members out."""

    def check_checksums(self) -> dict[str, pb.Divergence]:
        """Flag members whose state disagrees with the others'; returns the
        newly flagged ones with the verdict their watchers are told: the
        step, why (the step inputs that differ, fthsdp/coordinator/decisions/divergence.py)
        and whether their agent should give up (fthsdp/coordinator/job/checksum_vote.py)."""
        if self.quorum is None or not self.checksums_dirty:
            return {}  # at 10,000 replicas, not a scan every tick for nothing new
        self.checksums_dirty = False
        flagged = checksum_vote.flag(self.quorum, self.replicas, self._members)
        if flagged:
            self.schedule.now()
        return flagged

    def check_progress(self, now: float) -> tuple[dict[str, str], dict[str, str]]:
        """Take out the hung members (fthsdp/coordinator/decisions/hang.py); returns them and the
        stragglers to take out (the caller cordons them first), with why."""
        self.horizon_moved = False
        if self._unreachable:
            self._unreachable &= {rid for rid in self._unreachable
                                  if rid in self.replicas and self.replicas[rid].standing.unreachable}
            marked = [rid for rid in sorted(self._unreachable)
                      if self.replicas[rid].incarnation.session_id is not None]
            self.horizon_moved = self.reach.reprobe(marked, list(self._members), self._addresses(), now)
        if self.quorum is None or not self.progress.due(now):
            return {}, {}
        live = [rid for rid in self._members if self._live_member(rid)]
        steps = {rid: self.replicas[rid].incarnation.step for rid in live}
        hung, stragglers = self.progress.look(live, steps, now, self.quorum.id)
        for rid, why in hung.items():
            self.mark_hung(rid, why, now)
        if not hung:
            self._resolve_stuck(live, now)
        horizon = self.progress.horizon
        # Growth is pushed at once (the replicas' margin covers under a second);
        # shrinking is not urgent: at 10,000 watchers every push counts.
        if horizon >= self.hang_horizon + 1.0 or horizon <= 0.9 * self.hang_horizon:
            self.hang_horizon, self.horizon_moved = horizon, True
        return hung, stragglers

    def _addresses(self) -> dict[str, tuple[str, ...]]:
        return {rid: self.replicas[rid].incarnation.catch_up_addresses
                for rid in self._members if rid in self.replicas}

    def _resolve_stuck(self, live: list[str], now: float) -> None:
        """One step of a stuck collective's escalation: regroup, probe, take out
        (fthsdp/coordinator/decisions/stuck.py)."""
        assert self.quorum is not None  # only check_progress calls it, with a quorum
        if len(live) < len(self._members):
            return  # a member is being taken out anyway: the next quorum redoes the step without it
        sizes = {rid: self.replicas[rid].incarnation.world_size for rid in live}
        action = self.reach.look(self.progress.stuck, live, self.quorum.id, lambda: self.progress.low_step(live),
                                 sizes, self._addresses(), now, self.progress.limit)
        if action.act is Act.NOTHING:
            return
        extra = {"event": f"stuck_{action.act.value}", "job": self.name, "quorum_id": self.quorum.id,
                 "reason": action.reason}
        if action.act is Act.REGROUP:
            self.schedule.now()
        elif action.act is Act.PROBE:
            self.horizon_moved = True
        for rid, why in action.take_out.items():
            self.replicas[rid].standing.unreachable = why
            self._unreachable.add(rid)
            self.marks_to_store.add(rid)
            self.schedule.now()
            log.error("job %s: replica %s taken out: %s", self.name, rid, why,
                      extra={"event": "unreachable", "job": self.name, "replica": rid, "reason": why})
        log.warning("job %s: quorum %d: %s", self.name, self.quorum.id, action.reason, extra=extra)

    def reach_report(self, replica_id: str, shard_rank: int, probe_id: int,
                     reached: list[str], unreached: list[str], session_id: str = "", incarnation: str = "") -> bool:
        """One rank's answer to a probe (rank 0 with its session, the others
        with their incarnation's key); returns whether a replica kept out as
        unreachable was let back (it reaches every member again)."""
        entry = (self._session(replica_id, session_id) if shard_rank == 0
                 else self.of_incarnation(replica_id, incarnation))
        if shard_rank >= entry.incarnation.world_size:
            raise InvalidRequest(
                f"shard_rank {shard_rank} is outside replica {replica_id!r}'s {entry.incarnation.world_size} ranks")
        back = self.reach.answer(replica_id, shard_rank, probe_id, reached, unreached, entry.incarnation.world_size)
        if back is None or not entry.standing.unreachable:
            return False
        if not back.reaches_all:
            entry.standing.unreachable = f"unreachable from {', '.join(back.unreached)} over the data path"
            return False
        log.info("job %s: replica %s reaches every member over the data path again; it may catch up",
                 self.name, replica_id, extra={"event": "reachable", "job": self.name, "replica": replica_id})
        entry.standing.unreachable = ""
        self.marks_to_store.add(replica_id)
        self.schedule.now()
        return True

    def mark_hung(self, replica_id: str, why: str, now: float) -> None:
        """Take a member out (hung, or a straggler): the next decision drops it; its agents are told."""
        inc = self.replicas[replica_id].incarnation
        inc.hung_at, inc.hung_reason, inc.notice = now, why, why
        self.schedule.now()

    def _live_member(self, rid: str) -> bool:
        e = self.replicas.get(rid)
        inc = e.incarnation if e is not None else None
        return inc is not None and inc.session_id is not None and not inc.restarted and inc.hung_at is None
