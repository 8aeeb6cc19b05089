"""One job's membership table: plain, synchronous domain logic.

``JobState`` holds what the coordinator knows of each replica (heartbeats live
here, in memory only) and the current quorum. It never does I/O and takes the
time as an argument; ``fthsdp.coordinator.runtime`` persists its decisions to the
store before applying them, and the gRPC servicer is a thin layer above that.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import sys

from fthsdp.coordinator import divergence, replica_status, silence, watch_events
from fthsdp.coordinator.hang import HangRules
from fthsdp.coordinator.progress import ProgressBook
from fthsdp.coordinator.quorum import CatchUpSource, Decision, Member, Quorum, Rules, decide, find_diverged
from fthsdp.coordinator.reach_book import ReachBook
from fthsdp.coordinator.replica_entry import ReplicaEntry, seed_entries
from fthsdp.coordinator.status_view import finished_reason
from fthsdp.coordinator.stuck import Act
from fthsdp.core.errors import InvalidRequest, NotFound, StaleSession
from fthsdp.protos.v1 import coordinator_pb2 as pb

CHECKSUM_HISTORY = 32
"""Recent (step, checksum) reports kept per replica for comparison."""

log = logging.getLogger("fthsdp.coordinator")

_AGENT_FAILURES = (pb.AGENT_STATE_FAILED, pb.AGENT_STATE_RESTARTING, pb.AGENT_STATE_GAVE_UP)

DEFAULT_HANG_RULES = HangRules()
"""The hang and straggler rules of a job made without any (frozen: one shared instance)."""


class JobState:
    """Membership, heartbeats and the current quorum of one job."""

    def __init__(self, name: str, rules: Rules, hang_rules: HangRules = DEFAULT_HANG_RULES) -> None:
        self.name = name
        self.rules = rules
        self.progress = ProgressBook(hang_rules)  # every process's progress; the hang verdicts
        self.hang_horizon = hang_rules.ceiling  # what watchers were told of the longest a member may stall
        self.horizon_moved = False  # the last check_progress changed what watchers are told: they must hear of it
        self.reach = ReachBook()  # a stuck collective's regroup and probes (fthsdp/coordinator/stuck.py)
        self._unreachable: set[str] = set()
        """Replicas kept out as unreachable (``ReplicaEntry.unreachable``): asked to probe the members."""
        self.marks_to_store: set[str] = set()
        """Replicas whose unreachable mark was set or cleared and is not stored
        yet (``mark_records``): a coordinator that starts must keep a still-cut
        replica out, not let it back to fail its catch-up in a loop."""
        self.quorum: Quorum | None = None
        self.quorum_revision = 0
        self.replicas: dict[str, ReplicaEntry] = {}
        self.catch_up: dict[str, CatchUpSource] = {}
        self.agents: dict[str, tuple[pb.AgentState, int, str]] = {}
        self.reason = "no decision yet"
        self._members: dict[str, Member] = {}
        """The current quorum's members by replica id."""
        self._ranks: dict[str, int] = {}
        """Each member's position in the current quorum: its rank in the FTAR group."""
        self._decided_at = float("-inf")
        self._expiry_bound = (0.0, float("-inf"))
        """(timeout, t): no heartbeat timeout runs out before t (see needs_decision)."""
        self._silent: set[str] = set()
        """Non-members whose heartbeat timeout ran out (see notice_silent_outsiders)."""
        self.dirty = True
        """Something the decision reads changed since it last found the
        quorum settled. While not dirty, only time (a heartbeat timeout)
        can change the decision: see ``needs_decision``."""
        self.joiners_moved = False
        """A replica outside the quorum registered or heartbeated since the
        last decision: its progress feeds the next one, not urgently."""
        self.unsettled = False
        """The last decision was waiting (for arrivals to settle, joiners to
        catch up, a timeout): decide again, but not before ``poll_at``."""
        self.poll_at = float("-inf")
        """Set by the runtime from what a decision costs: at 10,000 replicas
        one takes tens of milliseconds, and polling them every tick while
        joiners arrive starved the coordinator."""
        self.checksums_dirty = False
        """A checksum arrived (or the members changed) since ``check_checksums`` last looked."""
        self._senders: int | None = None
        """Heartbeating processes (ranks of registered replicas), recounted after a session change."""
        self.committed_step = 0
        """The highest step any member of a quorum has reported: the state
        the job must not lose (fthsdp/coordinator/committed.py stores it)."""
        self.state_lost_step = 0
        """From the latest decision: the committed step no live replica holds (0: not lost)."""
        self.state_lost = ""
        """From the latest decision, while lost: what remains."""
        self.finished: pb.JobFinished | None = None
        """Set once every member of the last quorum left finished (stored,
        fthsdp/coordinator/committed.py): no quorum forms, and every watcher is
        told, until an operator reopens the job (``reopen``)."""
        self._left: dict[str, str] = {}
        """Why each member of the current quorum that left on purpose left ("finished", "drained")."""

    # ----- loading after a (re)start -------------------------------------------------

    def load(
        self,
        quorum: Quorum | None,
        quorum_revision: int,
        records: dict[str, tuple[pb.ReplicaRecord, int]],
        now: float,
        committed_step: int = 0,
    ) -> None:
        """Seed the table from the store. Known replicas are presumed alive for
        one heartbeat timeout so that a coordinator restart drops nobody who
        reconnects in time."""
        self.set_quorum(quorum, quorum_revision)
        self.committed_step = committed_step
        self.replicas.update(seed_entries(self._members, records, now))
        self._unreachable |= {rid for rid, e in self.replicas.items() if e.unreachable}

    # ----- replica calls -------------------------------------------------------------

    def record_needed(self, replica_id: str, address: str, world_size: int) -> tuple[pb.ReplicaRecord, int] | None:
        """The record to store before a registration, or None if the stored one is current."""
        entry = self.replicas.get(replica_id)
        if entry is not None and entry.record_revision and entry.address == address and entry.world_size == world_size:
            return None
        base = entry or ReplicaEntry(replica_id)
        rec = pb.ReplicaRecord(
            replica_id=replica_id,
            address=address,
            world_size=world_size,
            cordoned=base.cordoned,
            drain_requested=base.drain_requested,
            unreachable=base.unreachable,
        )
        return rec, base.record_revision

    def register(
        self,
        replica_id: str,
        address: str,
        world_size: int,
        step: int,
        quorum_id: int,
        now: float,
        record_revision: int | None = None,
        catch_up_addresses: tuple[str, ...] = (),
        restart_count: int = 0,
    ) -> str:
        """Register a new incarnation of a replica and return its session id.

        A member of the current quorum keeps its place only if it says it still
        trains in a quorum that admitted it; otherwise it restarted and lost its
        state, and the next decision replaces it with a joiner.
        """
        entry = self.replicas.setdefault(replica_id, ReplicaEntry(replica_id))
        member = self._members.get(replica_id)
        if member is not None:
            self.dirty = self.checksums_dirty = True  # a member restarted, or came back after a failover
        else:
            self.joiners_moved = True
        entry.address, entry.world_size, entry.step = address, world_size, step
        entry.catch_up_addresses, entry.catch_up_progress = tuple(catch_up_addresses), (0, 0)
        entry.catching_up = False
        entry.session_id = secrets.token_hex(8)
        self._senders = None
        entry.registered_at = entry.last_heartbeat = now
        entry.heard_from, entry.beating = True, False
        entry.disconnected_at = entry.failed_at = entry.ready_since = entry.diverged_at = entry.hung_at = None
        entry.hung_reason, entry.notice, entry.restart_count = "", "", restart_count
        entry.divergence, entry.caught_up = None, False  # its mismatch and strikes stay: see check_checksums
        self.progress.forget(replica_id)
        entry.checksums.clear()
        entry.inputs.clear()
        # Every other rank of the group must ping within a heartbeat timeout
        # of the registration, or the group counts as silent.
        entry.rank_heartbeats = {rank: now for rank in range(1, world_size)}
        entry.state_checksum, entry.checksum_step = "", 0
        entry.open_watches = 0  # streams of the old session no longer count
        entry.restarted = member is not None and quorum_id < member.joined_quorum_id
        # Its timeout may run out before any the last scan saw (or none was left to see).
        timeout, bound = self._expiry_bound
        self._expiry_bound = (timeout, min(bound, now + timeout))
        if member is not None and not entry.restarted:
            self.committed_step = max(self.committed_step, step)  # a member back after a failover
        if record_revision is not None:
            entry.record_revision = record_revision
        return entry.session_id

    def heartbeat(
        self,
        replica_id: str,
        session_id: str,
        step: int,
        ready: bool,
        state_checksum: str,
        checksum_step: int,
        now: float,
        recent: dict[int, str] | None = None,
        shard_rank: int = 0,
        catch_up_progress: tuple[int, int] = (0, 0),
        catching_up: bool = False,
        progress: pb.Progress | None = None,
        recent_inputs: dict[int, str] | None = None,
    ) -> pb.HeartbeatResponse:
        if shard_rank > 0:
            return self._rank_ping(replica_id, shard_rank, now, progress)
        entry = self._session(replica_id, session_id)
        if progress is not None:
            self.progress.report(replica_id, 0, progress, now)
        if ready != (entry.ready_since is not None):
            self.dirty = True
        elif replica_id not in self._members:
            self.joiners_moved = True  # a joiner's progress feeds the decision; members' steps do not
        if not entry.beating:
            entry.beating, entry.first_heartbeat = True, now
        entry.last_heartbeat, entry.heard_from, entry.step = now, True, step
        if step > self.committed_step and replica_id in self._members and not entry.restarted:
            self.committed_step = step
        entry.catch_up_progress, entry.catching_up = catch_up_progress, catching_up
        if ready and entry.ready_since is None:
            entry.ready_since = now
        elif not ready:
            entry.ready_since = None
        if state_checksum:
            entry.state_checksum, entry.checksum_step = state_checksum, checksum_step
            entry.checksums[checksum_step] = state_checksum
            self.checksums_dirty = True
        if recent:
            entry.checksums.update(recent)
            self.checksums_dirty = True
        if recent_inputs:
            # Interned: every replica reports the same few strings at a step.
            entry.inputs.update({s: sys.intern(v) for s, v in recent_inputs.items()})
        while len(entry.checksums) > CHECKSUM_HISTORY:
                del entry.checksums[min(entry.checksums)]
        while len(entry.inputs) > CHECKSUM_HISTORY:
            del entry.inputs[min(entry.inputs)]
        return pb.HeartbeatResponse(
            quorum_id=self.quorum.id if self.quorum else 0, drain_requested=entry.drain_requested
        )

    def _rank_ping(
        self, replica_id: str, shard_rank: int, now: float, progress: pb.Progress | None
    ) -> pb.HeartbeatResponse:
        entry = self.replicas.get(replica_id)
        if entry is None or entry.session_id is None:
            raise NotFound(f"replica {replica_id!r} is not registered in job {self.name!r}; its rank 0 registers it")
        if shard_rank >= entry.world_size:
            raise InvalidRequest(
                f"shard_rank {shard_rank} is outside replica {replica_id!r}'s {entry.world_size} ranks")
        entry.rank_heartbeats[shard_rank] = now
        if progress is not None:
            self.progress.report(replica_id, shard_rank, progress, now)
        return pb.HeartbeatResponse(quorum_id=self.quorum.id if self.quorum else 0,
                                    drain_requested=entry.drain_requested)

    def watch_opened(self, replica_id: str, session_id: str) -> None:
        entry = self._session(replica_id, session_id)
        entry.open_watches += 1
        entry.disconnected_at = None

    def watch_closed(self, replica_id: str, session_id: str, now: float) -> None:
        entry = self.replicas.get(replica_id)
        if entry is None or entry.session_id != session_id:
            return  # a superseded session's stream; the new one is what counts
        entry.open_watches = max(0, entry.open_watches - 1)
        if entry.open_watches == 0 and entry.failed_at is None:
            entry.disconnected_at = now
            self.dirty = True

    def leave(
        self, replica_id: str, session_id: str, failed: bool, now: float, reason: str = "", step: int = 0
    ) -> bool:
        """End a session. Returns True if the replica is gone for good (its
        record should be deleted); a failed replica stays listed as failed.
        A reason "failed: ..." is a failure too (a training script that
        raised leaves with it): a replica that is gone left on purpose, and
        members that all did so end the job's state rather than lose it
        (quorum rule 8)."""
        entry = self._session(replica_id, session_id)
        entry.session_id = None
        self.dirty, self._senders = True, None
        if failed or reason.startswith("failed"):
            entry.failed_at = now
            return False
        if replica_id in self._members:
            self._left[replica_id] = reason
            if not entry.restarted:  # its state, as its heartbeats would have said
                self.committed_step = max(self.committed_step, step)
        del self.replicas[replica_id]
        self.catch_up.pop(replica_id, None)
        self.progress.forget(replica_id)
        return True

    def agent_event(self, replica_id: str, state: pb.AgentState, restart_count: int, detail: str, now: float) -> bool:
        """Record a node agent's transition. Returns True if it failed the
        replica (a rank died): its session ends at once, so the next decision
        drops it without waiting for heartbeats to lapse."""
        self.agents[replica_id] = (state, restart_count, detail)
        entry = self.replicas.get(replica_id)
        if state in _AGENT_FAILURES and entry is not None and entry.session_id is not None:
            entry.failed_at, entry.session_id = now, None
            self.dirty, self._senders = True, None
            return True
        return False

    # ----- admin ---------------------------------------------------------------------

    def admin_record(self, replica_id: str, *, cordoned: bool | None = None, drain: bool | None = None):
        """The record to store for an admin change, with its expected revision."""
        entry = self.replicas.get(replica_id)
        if entry is None:
            raise NotFound(f"job {self.name!r} has no replica {replica_id!r}")
        rec = entry.record()
        if cordoned is not None:
            rec.cordoned = cordoned
        if drain is not None:
            rec.drain_requested = drain
        return rec, entry.record_revision

    def mark_records(self) -> list[tuple[pb.ReplicaRecord, int]]:
        """The records to store for the unreachable marks set or cleared
        since the last call, with their expected revisions; a record that
        fails to store is handed back with ``marks_to_store.add``."""
        out = [(self.replicas[rid].record(), self.replicas[rid].record_revision)
               for rid in sorted(self.marks_to_store) if rid in self.replicas]
        self.marks_to_store.clear()
        return out

    def apply_record(self, rec: pb.ReplicaRecord, revision: int) -> None:
        entry = self.replicas.get(rec.replica_id)
        if entry is not None:
            entry.cordoned, entry.drain_requested = rec.cordoned, rec.drain_requested
            entry.record_revision = revision
            self.dirty = True

    # ----- decisions -----------------------------------------------------------------

    def check_checksums(self) -> dict[str, pb.Divergence]:
        """Flag members whose state disagrees with the others'; returns the
        newly flagged ones with the verdict their watchers are told: the
        step, why (the step inputs that differ, fthsdp/coordinator/divergence.py)
        and whether their agent should give up."""
        if self.quorum is None or not self.checksums_dirty:
            return {}  # at 10,000 replicas, not a scan every tick for nothing new
        self.checksums_dirty = False
        members = {m.replica_id: m.joined_quorum_id for m in self.quorum.members}
        reports = {
            rid: e.checksums
            for rid, e in self.replicas.items()
            if rid in members and e.session_id is not None and not e.restarted
        }
        diverged = find_diverged(reports, members)
        flagged = {}
        for rid, step in diverged.items():
            entry = self.replicas[rid]
            if entry.diverged_at is None:
                entry.diverged_at = step
                flagged[rid] = entry.divergence = self._verdict(entry, step, reports, diverged)
                self.dirty = True
        for rid in reports:
            entry = self.replicas[rid]
            if entry.strikes and rid not in diverged and self._agreed_since_admission(rid, reports):
                entry.strikes, entry.mismatch = 0, ""  # a stretch without a mismatch: the catch-up worked
        return flagged

    def _verdict(self, entry: ReplicaEntry, step: int, reports, diverged: dict[str, int]) -> pb.Divergence:
        mine = entry.checksums.get(step)
        agreeing = {o: self.replicas[o].inputs.get(step, "") for o, h in reports.items()
                    if o not in diverged and h.get(step) not in (None, mine)}
        why = divergence.explain(entry.replica_id, step, entry.inputs.get(step, ""),
                                 divergence.members_inputs(agreeing))
        entry.strikes, give_up = divergence.strike(entry.strikes, entry.caught_up)
        entry.mismatch = divergence.gave_up(why, entry.strikes) if give_up else why
        return pb.Divergence(reason=entry.mismatch, step=step, restart_count=entry.restart_count,
                             strikes=entry.strikes, give_up=give_up)

    def _agreed_since_admission(self, rid: str, reports) -> bool:
        member = self._members.get(rid)
        if member is None:
            return False
        mine = reports[rid]
        agreed = (s for s, c in mine.items() if any(o != rid and h.get(s) == c for o, h in reports.items()))
        return divergence.resets(member.step, agreed)

    def check_progress(self, now: float) -> tuple[dict[str, str], dict[str, str]]:
        """Take out the hung members (fthsdp/coordinator/hang.py); returns them and the
        stragglers to take out (the caller cordons them first), with why."""
        self.horizon_moved = False
        if self._unreachable:
            self._unreachable &= {rid for rid in self._unreachable
                                  if rid in self.replicas and self.replicas[rid].unreachable}
            marked = [rid for rid in sorted(self._unreachable) if self.replicas[rid].session_id is not None]
            self.horizon_moved = self.reach.reprobe(marked, list(self._members), self._addresses(), now)
        if self.quorum is None or not self.progress.due(now):
            return {}, {}
        live = [rid for rid in self._members if self._live_member(rid)]
        hung, stragglers = self.progress.look(live, {rid: self.replicas[rid].step for rid in live}, now, self.quorum.id)
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
        return {rid: self.replicas[rid].catch_up_addresses for rid in self._members if rid in self.replicas}

    def _resolve_stuck(self, live: list[str], now: float) -> None:
        """One step of a stuck collective's escalation: regroup, probe, take out (fthsdp/coordinator/stuck.py)."""
        assert self.quorum is not None  # only check_progress calls it, with a quorum
        if len(live) < len(self._members):
            return  # a member is being taken out anyway: the next quorum redoes the step without it
        action = self.reach.look(self.progress.stuck, live, self.quorum.id, self.progress.low_step(live),
                                 {rid: self.replicas[rid].world_size for rid in live}, self._addresses(), now,
                                 self.progress.limit)
        if action.act is Act.NOTHING:
            return
        extra = {"event": f"stuck_{action.act.value}", "job": self.name, "quorum_id": self.quorum.id,
                 "reason": action.reason}
        if action.act is Act.REGROUP:
            self.dirty = True
        elif action.act is Act.PROBE:
            self.horizon_moved = True
        for rid, why in action.take_out.items():
            self.replicas[rid].unreachable = why
            self._unreachable.add(rid)
            self.marks_to_store.add(rid)
            self.dirty = True
            log.error("job %s: replica %s taken out: %s", self.name, rid, why,
                      extra={"event": "unreachable", "job": self.name, "replica": rid, "reason": why})
        log.warning("job %s: quorum %d: %s", self.name, self.quorum.id, action.reason, extra=extra)

    def reach_report(self, replica_id: str, shard_rank: int, probe_id: int,
                     reached: list[str], unreached: list[str]) -> bool:
        """One rank's answer to a probe; returns whether a replica kept out
        as unreachable was let back (it reaches every member again)."""
        entry = self.replicas.get(replica_id)
        if entry is None or entry.session_id is None:
            raise NotFound(f"replica {replica_id!r} is not registered in job {self.name!r}")
        if shard_rank >= entry.world_size:
            raise InvalidRequest(
                f"shard_rank {shard_rank} is outside replica {replica_id!r}'s {entry.world_size} ranks")
        back = self.reach.answer(replica_id, shard_rank, probe_id, reached, unreached, entry.world_size)
        if back is None or not entry.unreachable:
            return False
        if not back.reaches_all:
            entry.unreachable = f"unreachable from {', '.join(back.unreached)} over the data path"
            return False
        log.info("job %s: replica %s reaches every member over the data path again; it may catch up",
                 self.name, replica_id, extra={"event": "reachable", "job": self.name, "replica": replica_id})
        entry.unreachable = ""
        self.marks_to_store.add(replica_id)
        self.dirty = self.joiners_moved = True
        return True

    def mark_hung(self, replica_id: str, why: str, now: float) -> None:
        """Take a member out (hung, or a straggler): the next decision drops it; its agents are told."""
        entry = self.replicas[replica_id]
        entry.hung_at, entry.hung_reason, entry.notice = now, why, why
        self.dirty = True

    def _live_member(self, rid: str) -> bool:
        e = self.replicas.get(rid)
        return e is not None and e.session_id is not None and not e.restarted and e.hung_at is None

    def needs_decision(self, now: float) -> bool:
        """Whether deciding now could change anything: something changed since
        the quorum was last found settled, or a heartbeat timeout ran out. At
        10,000 replicas a decision costs tens of milliseconds; this check a
        scan of floats."""
        ran_out = self._ran_out(now)
        if self.dirty:
            return True
        if (self.joiners_moved or self.unsettled) and now >= self.poll_at:
            return True
        # A member's timeout is decided on at once; anyone else's (a joiner,
        # or a replica whose heartbeats never got through) at the poll time.
        if any(rid in self._members for rid in ran_out):
            return True
        if ran_out:
            self.joiners_moved = True
        return self.joiners_moved and now >= self.poll_at

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
                            and self.replicas[rid].session_id is not None and not self.replicas[rid].notice)
        return [rid for x, rid in expiries if since < x <= now]

    def set_pace(self, heartbeat_timeout: float, join_settle: float) -> None:
        """Adopt a stretched heartbeat timeout and join settle (the runtime's
        pace). Under load they move often: neither is urgent by itself, but
        a shorter timeout may have run out for members before the last
        decision, so every deadline is looked at again."""
        rules = self.rules
        if heartbeat_timeout != rules.heartbeat_timeout or join_settle != rules.join_settle:
            self.rules = dataclasses.replace(rules, heartbeat_timeout=heartbeat_timeout, join_settle=join_settle)
            self.joiners_moved = True
            if heartbeat_timeout < rules.heartbeat_timeout:
                self._decided_at = float("-inf")

    def _decide(self, now: float) -> Decision:
        if self.finished is not None:
            # Nothing left to train: nobody is admitted nor named a source;
            # arrivals are told (WatchEvent.finished) and exit.
            return Decision(None, finished_reason(self.name, self.finished.step), self.finished.step, {}, settled=True)
        views = {rid: e.view() for rid, e in self.replicas.items()}
        current_sources = {rid: c.replica_id for rid, c in self.catch_up.items()}
        return decide(self.quorum, views, now, self.rules, current_sources, self.committed_step, self.reach.regroup)

    def evaluate(self, now: float) -> Decision:
        decision = self._decide(now)
        self.dirty = self.joiners_moved = False
        self.unsettled, self._decided_at = not decision.settled, now
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
        """Adopt a stored finished mark; returns what to apply instead of
        ``decision`` (which may have admitted a late arrival)."""
        self.finished = mark
        return dataclasses.replace(decision, members=None, catch_up={}, settled=True,
                                   reason=finished_reason(self.name, mark.step))

    def reopen(self) -> None:
        """Adopt a stored reopen: quorums form again, from the replicas there are."""
        self.finished = None
        self.dirty = True

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
                    entry.restarted, entry.ready_since = False, None
            self.committed_step = max(self.committed_step, quorum.step)  # what its members hold
        self.catch_up = dict(decision.catch_up)
        for rid in self.catch_up:
            entry = self.replicas.get(rid)
            if entry is not None:
                entry.caught_up = True  # behind the members: what it trains on comes from a catch-up
        self.reason = decision.reason
        self.state_lost_step, self.state_lost = decision.state_lost_step, decision.state_lost

    def _notice_silent(self, quorum: Quorum) -> None:
        """Members dropped for silence alone, their session open: their agents must end them
        (fthsdp/coordinator/silence.py)."""
        noticed = silence.dropped_members(self.replicas, self._members, set(quorum.member_ids), quorum.id,
                                          self.rules.heartbeat_timeout)
        for rid, why in noticed.items():
            self.replicas[rid].notice = why

    def notice_silent_outsiders(self, now: float) -> dict[str, str]:
        """Replicas outside the quorum whose heartbeats ran out with their
        session open (a stopped joiner): given a notice, as a silent member
        is; returns the newly noticed ones (their watchers must be told)."""
        candidates, self._silent = self._silent, set()
        noticed = silence.silent_outsiders(self.replicas, candidates, self._members, self.rules.heartbeat_timeout, now)
        for rid, why in noticed.items():
            self.replicas[rid].notice = why
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
        self.dirty = True

    # ----- views ---------------------------------------------------------------------

    def replica_state(self, entry: ReplicaEntry, now: float) -> int:
        return replica_status.state_of(self, entry, now)

    def replica_statuses(self, now: float) -> list[pb.ReplicaStatus]:
        return replica_status.statuses(self, now)

    def watch_event(self, replica_id: str, leader: str) -> pb.WatchEvent:
        """What is particular to one watcher (fthsdp/coordinator/watch_events.py)."""
        return watch_events.own_event(self, replica_id, leader)

    def rank_of(self, replica_id: str) -> int | None:
        """A member's position in the current quorum: its rank in the FTAR group."""
        return self._ranks.get(replica_id)

    # ----- helpers -------------------------------------------------------------------

    def heartbeat_ages(self, now: float) -> list[float]:
        """Seconds since each connected replica was last heard of (its most silent rank)."""
        return [
            now - e.view_heartbeat()
            for e in self.replicas.values()
            if e.session_id is not None and e.disconnected_at is None
        ]

    def senders(self) -> int:
        """Processes that heartbeat: every rank of every registered replica."""
        if self._senders is None:
            self._senders = sum(e.world_size for e in self.replicas.values() if e.session_id is not None)
        return self._senders

    def is_member(self, replica_id: str) -> bool:
        return replica_id in self._members

    def set_quorum(self, quorum: Quorum | None, revision: int) -> None:
        """Adopt ``quorum`` (stored at ``revision``) as the current one."""
        self.quorum, self.quorum_revision = quorum, revision
        self._members = {m.replica_id: m for m in quorum.members} if quorum else {}
        self._ranks = {rid: rank for rank, rid in enumerate(self._members)}  # the list's order
        self._left = {rid: why for rid, why in self._left.items() if rid in self._members}
        self.dirty = self.checksums_dirty = True

    def _session(self, replica_id: str, session_id: str) -> ReplicaEntry:
        entry = self.replicas.get(replica_id)
        if entry is None or entry.session_id is None:
            raise NotFound(f"replica {replica_id!r} is not registered in job {self.name!r}; register first")
        if entry.session_id != session_id:
            raise StaleSession(
                f"session {session_id!r} of replica {replica_id!r} was replaced by a newer registration"
            )
        return entry
