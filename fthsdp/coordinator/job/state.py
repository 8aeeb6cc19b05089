"""One job's membership table: plain, synchronous domain logic.

``JobState`` holds what the coordinator knows of each replica (heartbeats live
here, in memory only) and the current quorum. It never does I/O and takes the
time as an argument; the runtime (``fthsdp.coordinator.engine.runtime``, its loop in
``fthsdp.coordinator.engine.decision_loop``) persists its decisions to the store
before applying them, and the gRPC servicer is a thin layer above that.

This module is its state machine: when to decide (``needs_decision``), the
decision (``evaluate``, fthsdp/coordinator/decisions/quorum.py) and adopting it once
stored (``apply``, ``finish``, ``give_up_state``). Its fields and shared
lookups are in fthsdp/coordinator/job/table.py, what the replicas' calls
change in fthsdp/coordinator/job/replica_calls.py and the checks that take
members out in fthsdp/coordinator/job/member_checks.py.
"""

from __future__ import annotations

import dataclasses

from fthsdp.coordinator.decisions import lease
from fthsdp.coordinator.decisions.quorum import decide
from fthsdp.coordinator.decisions.quorum_types import Decision, Quorum, Restoring
from fthsdp.coordinator.decisions.status_view import finished_reason
from fthsdp.coordinator.job import silence
from fthsdp.coordinator.job.member_checks import MemberChecks
from fthsdp.coordinator.job.replica_calls import ReplicaCalls
from fthsdp.protos.v1 import coordinator_pb2 as pb


class JobState(ReplicaCalls, MemberChecks):
    """Membership, heartbeats and the current quorum of one job."""

    # ----- decisions -----------------------------------------------------------------

    def needs_decision(self, now: float) -> bool:
        """Whether deciding now could change anything: something changed since
        the quorum was last found settled, or a heartbeat timeout ran out. At
        10,000 replicas a decision costs tens of milliseconds; this check a
        scan of floats."""
        ran_out = self._ran_out(now)
        # A member's timeout is decided on at once; anyone else's (a joiner,
        # or a replica whose heartbeats never got through) at the poll time.
        if any(rid in self._members for rid in ran_out):
            return True  # found by this scan, decided on now (the decision counts it out)
        if ran_out:
            self.schedule.soon()
        return self.schedule.due(now)

    def _ran_out(self, now: float) -> list[str]:
        """Replicas whose heartbeat timeout ran out since the last decision
        (those that ran out before it were part of it); every silent one
        outside the quorum is kept for ``notice_silent_outsiders``. Replicas
        loaded from the store after a restart count too: they have no session
        yet, but a timeout. The scan runs only once the earliest expiry it found is
        reached: heartbeats only push expiries later, and a replica
        registering later expires later (the coordinator ticks 10 times a
        second; at 10,000 replicas a scan per tick was a tenth of its CPU)."""
        timeout, since = self.rules.heartbeat_timeout, self._decided_at
        if timeout == self._expiry_bound[0] and now < self._expiry_bound[1]:
            return []
        expiries = [(e.view_heartbeat() + timeout, rid) for rid, e in self.replicas.items()]
        self._expiry_bound = (timeout, min((x for x, _ in expiries if x > now), default=float("inf")))
        # Outsiders silent by now, whenever their timeout ran out: a decision
        # since then counted them out, but gave no notice.
        self._silent.update(rid for x, rid in expiries if x <= now and rid not in self._members
                            and self.replicas[rid].incarnation.session_id is not None
                            and not self.replicas[rid].incarnation.notice)
        return [rid for x, rid in expiries if since < x <= now]

    def set_pace(self, heartbeat_timeout: float, join_settle: float, heartbeat_interval: float = 0.0) -> None:
        """Adopt a stretched heartbeat timeout and join settle (the runtime's
        pace), and the member lease that goes with the interval. Under load
        they move often: neither is urgent by itself, but a shorter timeout
        may have run out for members before the last decision, so every
        deadline is looked at again."""
        rules = self.rules
        self.lease_s = lease.granted(rules.member_lease, heartbeat_interval)
        if heartbeat_timeout != rules.heartbeat_timeout or join_settle != rules.join_settle:
            self.rules = dataclasses.replace(rules, heartbeat_timeout=heartbeat_timeout, join_settle=join_settle)
            self.schedule.soon()
            if heartbeat_timeout < rules.heartbeat_timeout:
                self._decided_at = float("-inf")

    def _decide(self, now: float) -> Decision:
        if self.finished is not None:
            # Nothing left to train: nobody is admitted nor named a source;
            # arrivals are told (WatchEvent.finished) and exit.
            return Decision(None, finished_reason(self.name, self.finished.step), self.finished.step, {}, settled=True)
        views = {rid: e.view() for rid, e in self.replicas.items()}
        current_sources = {rid: c.replica_id for rid, c in self.catch_up.items()}
        return decide(self.quorum, views, now, self.rules, current_sources, self.committed_step, self.reach.regroup,
                      restoring=self._restoring(), outage=self.outage)

    def _restoring(self) -> Restoring | None:
        """While a restore is under way: the replicas its first quorum waits
        for, the members when the state was lost (quorum rule 9): those of the
        quorum that last trained a step, and of the current one (formed since,
        as the members' streams closed one by one)."""
        if self.restore is None:
            return None
        trained = self.trained or self.quorum  # after a coordinator restart: the stored quorum alone
        members = {*(trained.member_ids if trained else ()), *(self.quorum.member_ids if self.quorum else ())}
        return Restoring(frozenset(members), trained.id if trained else 0)

    def evaluate(self, now: float) -> Decision:
        decision = self._decide(now)
        self.schedule.decided(decision.settled)
        self._decided_at = now
        return decision

    def finish_mark(self, decision: Decision, unix_ms: int) -> pb.JobFinished | None:
        """The finished mark to store before ``decision`` is applied, or None.

        A job is finished when the state ended on purpose (every member of
        the last quorum left, none failed: ``Decision.state_ended``) and at
        least one of them left "finished": it reached the end of the
        script. Members that all left "drained" (an operator moving the
        job) end the state without finishing it: the next replicas start
        over. A member that leaves "finished" while others train on
        finishes nothing: the quorum drops it and goes on."""
        if not decision.state_ended or self.quorum is None or self.finished is not None:
            return None
        if not any(self._left.get(rid) == "finished" for rid in self.quorum.member_ids):
            return None
        return pb.JobFinished(step=self.committed_step, unix_ms=unix_ms, quorum_id=self.quorum.id)

    def finish(self, mark: pb.JobFinished, decision: Decision) -> Decision:
        """Adopt a stored finished mark (the ledger holds it); returns what to
        apply instead of ``decision`` (which may have admitted a late arrival)."""
        return dataclasses.replace(decision, members=None, catch_up={}, settled=True,
                                   reason=finished_reason(self.name, mark.step))

    def reopen(self) -> None:
        """Adopt a stored reopen (the ledger holds it): quorums form again, from the replicas there are."""
        self.schedule.now()

    def apply(self, decision: Decision, quorum: Quorum | None, revision: int) -> None:
        """Adopt a decision once its quorum (if any) is safely in the store."""
        if decision.state_ended:
            self.committed_step = 0  # its members ended the state on purpose: the next ones start over
        if quorum is not None:
            self._notice_silent(quorum)
            self.set_quorum(quorum, revision)
            self.reach.quorum_changed()
            for m in quorum.members:
                entry = self.replicas.get(m.replica_id)
                if entry is not None and m.joined_quorum_id == quorum.id:
                    entry.incarnation.restarted, entry.incarnation.ready_since = False, None
            self.committed_step = max(self.committed_step, quorum.step)  # what its members hold
        self.catch_up = dict(decision.catch_up)
        for rid in self.catch_up:
            entry = self.replicas.get(rid)
            if entry is not None:
                entry.incarnation.caught_up = True  # behind the members: what it trains on comes from a catch-up
        self.state_lost_step, self.state_lost = decision.state_lost_step, decision.state_lost
        self.outage = decision.outage
        restore = self.restore
        if restore is not None and self.committed_step > restore.step:
            self.restore = None  # restored: a quorum trains on from it (a replica behind copies a member now)
        if self.restore is not None:
            # Until then every replica loads the checkpoint itself: a quorum formed at its
            # step may still wait for more replicas, and a waiting member serves no copy.
            self.catch_up = {}
        if restore is not None and self.restore is not None and decision.state_lost_step == restore.step:
            self.reason = (f"restoring the checkpoint of step {restore.step}: waiting for replicas to load it "
                           f"({decision.state_lost})")
        else:
            self.reason = decision.reason

    def _notice_silent(self, quorum: Quorum) -> None:
        """Members dropped for silence alone, their session open: their agents must end them
        (fthsdp/coordinator/job/silence.py)."""
        noticed = silence.dropped_members(self.replicas, self._members, set(quorum.member_ids), quorum.id,
                                          self.rules.heartbeat_timeout)
        for rid, why in noticed.items():
            self.replicas[rid].incarnation.notice = why

    def notice_silent_outsiders(self, now: float) -> dict[str, str]:
        """Replicas outside the quorum whose heartbeats ran out with their
        session open (a stopped joiner): given a notice, as a silent member
        is; returns the newly noticed ones (their watchers must be told)."""
        candidates, self._silent = self._silent, set()
        noticed = silence.silent_outsiders(self.replicas, candidates, self._members, self.rules.heartbeat_timeout, now)
        for rid, why in noticed.items():
            self.replicas[rid].incarnation.notice = why
        return noticed

    def lost_step_now(self, now: float) -> int:
        """The step at which the state is lost as of ``now`` (0: not lost),
        decided afresh; nothing is applied."""
        return self._decide(now).state_lost_step

    def give_up_state(self, committed_step: int) -> None:
        """Adopt a give-up once it is stored: the committed step starts over
        (at 0, or what another coordinator stored with its give-up) and the
        loss is over; the next decision forms a quorum of whoever is there."""
        self.committed_step = committed_step
        self.state_lost_step, self.state_lost = 0, ""
        self.schedule.now()
