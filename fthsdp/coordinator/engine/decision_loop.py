"""The decision loop: every job's next quorum, decided, stored, applied, pushed.

Each tick (``tick_interval``), or at once when something urgent wakes it (a
member lost, a replica ready), the loop takes each job through one
decision, in order:

* **check**: diverged checksums, hangs and stragglers, unreachable marks
  (a straggler's cordon and the marks stored first), the heartbeat pace,
  silent outsiders; and whether anything could have changed;
* **decide**: the quorum decision (``JobState.evaluate``,
  fthsdp/coordinator/job/state.py) and what of it is durable: the finished
  mark, the next quorum, a lost state's restore
  (fthsdp/coordinator/engine/outcome.py);
* **persist**: that, in one transaction of the job's ledger, conditioned on
  the leader's key (fthsdp/coordinator/ledger/writer.py): a quorum id that
  reached a replica is durable, so ids never go backwards after a restart;
* **apply**: the decision adopted by the job's table; **notify**: the
  watchers woken once, if anything they are sent changed.

Apart from the runtime (fthsdp/coordinator/engine/runtime.py), which answers the
replicas' and operators' calls as they come: the loop is what runs on its
own, under each job's lock, and never on a call's path.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from fthsdp.coordinator.decisions.quorum import names, settle_for
from fthsdp.coordinator.decisions.quorum_types import Decision, Quorum
from fthsdp.coordinator.engine import checkpoints, committed
from fthsdp.coordinator.engine.loop_lag import LagWindow, backlog, lag_allowance
from fthsdp.coordinator.engine.metrics import Metrics
from fthsdp.coordinator.engine.outcome import Checked, Outcome, numbered
from fthsdp.coordinator.engine.served_job import ServedJob
from fthsdp.coordinator.ledger.codec import quorum_to_pb
from fthsdp.coordinator.ledger.writer import LedgerConflict, NotLeading
from fthsdp.core.errors import StoreError
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")

BACKLOG_EVERY = 0.5
"""Seconds between measurements of the heartbeat backlog."""

POLL_GAP_PER_COST = 19.0
"""An unsettled decision is taken again after this many times what it cost
(so polling takes at most a twentieth of the coordinator's time)."""


class DecisionLoop:
    """The runtime's decision loop over its jobs (``CoordinatorRuntime.decisions``)."""

    def __init__(
        self,
        tick_interval: float,
        jobs: dict[str, ServedJob],
        metrics: Metrics,
        lag: LagWindow,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.tick_interval = tick_interval
        """Seconds between decisions when nothing wakes the loop (--tick-interval)."""
        self.jobs = jobs
        self.metrics = metrics
        self.lag = lag
        self.clock = clock
        self.wall = wall
        self._wake = asyncio.Event()
        self.stopped = False
        """Set when the runtime stops: no decision is taken after it."""

    def wake(self) -> None:
        """Decide now rather than at the next tick."""
        self._wake.set()

    async def run(self) -> None:
        """Decide for every job each tick, or at once when woken (``wake``)."""
        while not self.stopped:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation
            # that arrives as the wake-up completes, and the loop would never
            # stop (the coordinator's shutdown waits for it).
            try:
                async with asyncio.timeout(self.tick_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            for job in self.jobs.values():
                try:
                    if job.state.finished is not None and not job.hosts.finished:
                        job.hosts.finish(f"job finished at step {job.state.finished.step}")
                    elif job.state.finished is None and job.hosts.finished:
                        job.hosts.reopen()
                    job.hosts.tick(self.clock(), job.pacer.current.timeout + self.lag.worst(self.clock()))
                    await self.evaluate(job)
                    # After the decision and its push, outside the job's lock (fthsdp/coordinator/engine/committed.py).
                    await committed.sync(job.committed, job.state, self.clock(), int(self.wall() * 1000))
                    await checkpoints.sync(job.checkpoints, job.state.name, self.clock())
                except Exception:  # the loop must survive anything one job does
                    log.exception("job %s: quorum evaluation failed", job.state.name)

    async def evaluate(self, job: ServedJob) -> None:
        """One decision for ``job``, in order: check, decide, persist, apply, notify."""
        async with job.lock:
            if self.stopped:
                return
            checked = self._check(job)
            if checked is None:
                return
            outcome = dataclasses.replace(self._decide(job), records=checked.records,
                                          stragglers=checked.stragglers)
            stored = await self._persist(job, outcome)
            if stored is None:
                return
            self._apply(job, stored)

    def _check(self, job: ServedJob) -> Checked | None:
        """What takes members out before a decision (diverged checksums, hangs
        and stragglers, unreachable marks), the heartbeat pace, silent
        outsiders. Returns None if no decision is due, else the replica
        records to store with it."""
        for rid, verdict in job.state.check_checksums().items():
            log.warning("job %s: replica %s's state checksum disagrees at step %d: %s; %s", job.state.name, rid,
                        verdict.step, verdict.reason,
                        "its agent gives up" if verdict.give_up else "it is taken out and must catch up",
                        extra={"event": "checksum_mismatch", "job": job.state.name, "replica": rid,
                               "step": verdict.step, "reason": verdict.reason, "strikes": verdict.strikes,
                               "give_up": verdict.give_up})
        stragglers = self._take_out_hung(job)
        # The unreachable marks set or cleared since the last decision, then the
        # stragglers' cordons: stored with the decision, before the quorum that
        # takes them out is pushed, so that a coordinator that starts next keeps
        # a still-cut replica or a straggler out.
        records = {rec.replica_id: rec for rec, _ in job.state.mark_records()}
        for rid in stragglers:
            records[rid] = job.state.admin_record(rid, cordoned=True)[0]
        self._pace(job)
        due = job.state.needs_decision(self.clock())
        self._notice_silent_outsiders(job)
        if not due and not records:
            return None
        return Checked(tuple(records.values()), stragglers)

    def _decide(self, job: ServedJob) -> Outcome:
        """The decision and what of it is durable: the finished mark, the next
        quorum, the restore of a lost state (nothing is stored or applied yet)."""
        began, now = time.perf_counter(), self.clock()
        decision = job.state.evaluate(now)
        # Polling an unsettled decision (joiners arriving) takes at most
        # a twentieth of the loop; anything urgent (a member lost) marks the
        # job's decision due at once (fthsdp/coordinator/job/schedule.py).
        job.state.schedule.poll_after(now + POLL_GAP_PER_COST * (time.perf_counter() - began))
        unix_ms = int(self.wall() * 1000)
        mark = job.state.finish_mark(decision, unix_ms)
        if mark is not None:
            # Stored before anything is applied or pushed: a coordinator
            # restart must still know, and a late arrival never be admitted.
            job.change_since = None
            return Outcome(job.state.finish(mark, decision), finished=mark)
        if decision.changes_quorum:
            if job.change_since is None:
                job.change_since = now
            return Outcome(decision, quorum=numbered(job.state.quorum, decision, job.epoch, job.state.generation,
                                                     unix_ms))
        job.change_since = None
        if not (job.settings.auto_restore and decision.state_lost_step):
            return Outcome(decision)
        record, to_store = checkpoints.to_restore(job.checkpoints, job.committed, decision.state_lost_step)
        if record is None:
            return Outcome(decision)
        if not to_store:
            return Outcome(decision, offer=record)
        return Outcome(decision, restore=checkpoints.restore_message(record, decision.state_lost_step, unix_ms,
                                                                     "automatic"))

    async def _persist(self, job: ServedJob, outcome: Outcome) -> Outcome | None:
        """Store what is durable of ``outcome`` in one transaction of the job's
        ledger; returns what to apply (None: nothing, decide again)."""
        if not outcome.durable:
            return outcome
        name = job.state.name
        mine = job.ledger.current.committed
        try:
            await job.ledger.update(outcome.change)
        except NotLeading as e:
            log.error("job %s: %s", name, e)
            self._unstage(job, outcome, e)
            return None
        except LedgerConflict as e:
            log.error("job %s: %s; deciding again", name, e)
            self._unstage(job, outcome, e)
            self._adopt(job, e, mine)
            job.state.schedule.now()
            return None
        except StoreError as e:
            self._unstage(job, outcome, e)
            return self._pending(job, outcome, e)
        return outcome

    def _pending(self, job: ServedJob, outcome: Outcome, e: StoreError) -> Outcome | None:
        """An outcome the store could not take: what of it may still be applied (None: nothing)."""
        if outcome.finished is not None:
            pending = f"the job finished at step {outcome.finished.step}; storing that is pending ({e})"
            self._log_reason(job, pending)
            job.state.reason = pending
            job.state.schedule.now()
            return None
        if outcome.quorum is not None:
            pending = f"quorum change pending, the store is unavailable ({e}): {outcome.decision.reason}"
            self._log_reason(job, pending)
            job.state.reason = pending
            return None
        if outcome.restore is not None:
            log.warning("job %s: restoring the checkpoint of step %d is pending: %s", job.state.name,
                        outcome.restore.checkpoint.step, e)
        # The decision itself stored nothing: applied.
        return dataclasses.replace(outcome, restore=None, records=(), stragglers={})

    def _adopt(self, job: ServedJob, conflict: LedgerConflict, mine: pb.CommittedStep | None) -> None:
        """Another coordinator moved the job's keys on: its quorum (so that our
        next id is above it) and its committed step are taken as they are; a
        replica's record keeps their flags (an operator's cordon or drain is
        the newer intent) and ours are written over it with the next decision."""
        theirs = job.ledger.current.quorum
        if job.keys.quorum in conflict.keys and theirs is not None:
            job.state.set_quorum(theirs, job.ledger.revisions.get(job.keys.quorum, 0))
            job.set_quorum(quorum_to_pb(theirs))
            job.notify()
        if job.keys.committed in conflict.keys:
            committed.adopt(job.state, committed.Adopted(job.ledger.current.committed or pb.CommittedStep(), mine))
        for rid, rec in job.ledger.current.records.items():
            entry = job.state.replicas.get(rid)
            if entry is None or job.keys.replica(rid) not in conflict.keys:
                continue
            merged = pb.ReplicaRecord(replica_id=rid, cordoned=entry.standing.cordoned or rec.cordoned,
                                      drain_requested=entry.standing.drain_requested or rec.drain_requested)
            job.state.apply_record(merged, job.ledger.revisions.get(job.keys.replica(rid), 0))

    def _apply(self, job: ServedJob, outcome: Outcome) -> None:
        """Adopt a stored outcome, log it, and tell the watchers what changed."""
        state, decision, quorum = job.state, outcome.decision, outcome.quorum
        if outcome.finished is not None:
            job.committed.written_at = self.clock()
            mark = outcome.finished
            log.info("job %s: finished at step %d: every member of quorum %d left, finished; no quorum forms "
                     "until an operator reopens it", state.name, mark.step, mark.quorum_id,
                     extra={"event": "job_finished", "job": state.name, "step": mark.step,
                            "quorum_id": mark.quorum_id})
        before, lost_before, step_before = state.catch_up, state.state_lost_step, state.committed_step
        revision = job.ledger.revisions.get(job.keys.quorum, 0) if quorum is not None else state.quorum_revision
        state.apply(decision, quorum, revision)
        self._taken_out(job, outcome)
        if outcome.restore is not None:
            checkpoints.restored(job.committed, state, outcome.restore, self.clock())
            job.notify()
            return
        if outcome.offer is not None and state.restore is None:
            state.restore = outcome.offer  # under way since before a coordinator restart: offered again
        if quorum is not None:
            self._pushed(job, quorum, decision)
        self._log_lease_wait(job, decision)
        self._log_reason(job, decision.reason)
        # A new reason alone wakes nobody: at 10,000 watchers every push
        # counts; each event carries the latest reason anyway. A state
        # loss does: the replicas must know why they wait.
        ended = step_before if decision.state_ended and outcome.finished is None else 0
        if (committed.report_transition(state, lost_before, ended) or quorum is not None
                or before != state.catch_up or outcome.finished is not None):
            job.notify()

    def _pushed(self, job: ServedJob, quorum: Quorum, decision: Decision) -> None:
        """A stored quorum becomes what watchers are pushed; counted, timed and logged."""
        job.set_quorum(quorum_to_pb(quorum))
        self.metrics.quorum_changes.inc(job=job.state.name)
        assert job.change_since is not None  # set when the change began (under the job's lock)
        self.metrics.formation.observe(self.clock() - job.change_since, job=job.state.name)
        job.change_since = None
        job.remember(quorum)
        log.info(
            "job %s: quorum %d members=[%s]: %s",
            job.state.name, quorum.id, names(quorum.member_ids, shown=32), quorum.reason,
            extra={"job": job.state.name, "quorum_id": quorum.id, "members": list(quorum.member_ids),
                   "reason": quorum.reason, "event": "quorum_change"},
        )
        job.logged_reason = decision.reason

    def _take_out_hung(self, job: ServedJob) -> dict[str, str]:
        """Members that others waited for past the hang limit, taken out; and
        the stragglers to take out once their cordons are stored (so that they
        are not admitted again): returned, with why."""
        hung, stragglers = job.state.check_progress(self.clock())
        for rid, why in hung.items():
            log.error("job %s: replica %s taken out: %s", job.state.name, rid, why,
                      extra={"event": "hang", "job": job.state.name, "replica": rid, "reason": why})
            self.metrics.taken_out.inc(job=job.state.name, reason="hung")
        if job.state.horizon_moved:
            job.notify()  # replicas waiting in the all-reduce wait this long for a verdict
        return stragglers

    def _unstage(self, job: ServedJob, outcome: Outcome, why: Exception) -> None:
        """The records of an outcome that was not stored: the marks go with the
        next decision; a straggler stays in (it was not cordoned), and is found
        again if it stays slow."""
        for rec in outcome.records:
            if rec.replica_id in outcome.stragglers:
                log.warning("job %s: straggler %s not taken out, it could not be cordoned: %s", job.state.name,
                            rec.replica_id, why)
            else:
                job.state.marks_to_store.add(rec.replica_id)

    def _taken_out(self, job: ServedJob, outcome: Outcome) -> None:
        """The records stored with ``outcome`` applied; its stragglers, cordoned, taken out by the next decision."""
        state = job.state
        for rec in outcome.records:
            state.apply_record(rec, job.ledger.revisions.get(job.keys.replica(rec.replica_id), 0))
        for rid, why in outcome.stragglers.items():
            state.mark_hung(rid, why, self.clock())
            log.error("job %s: replica %s taken out: %s", state.name, rid, why,
                      extra={"event": "straggler", "job": state.name, "replica": rid, "reason": why})
            self.metrics.taken_out.inc(job=state.name, reason="straggler")
        if outcome.stragglers:
            job.notify()  # their agents are told
            self.wake()  # the next decision drops them

    def _notice_silent_outsiders(self, job: ServedJob) -> None:
        """A stopped joiner's agent is told to end it, as a stopped member's is (fthsdp/coordinator/job/silence.py)."""
        noticed = job.state.notice_silent_outsiders(self.clock())
        for rid, why in noticed.items():
            log.error("job %s: replica %s must be ended: %s", job.state.name, rid, why,
                      extra={"event": "silent", "job": job.state.name, "replica": rid, "reason": why})
            self.metrics.taken_out.inc(job=job.state.name, reason="silent")
        if noticed:
            job.notify()

    def _pace(self, job: ServedJob) -> None:
        """Stretch the heartbeat interval (and timeout) to the budget, for the
        ranks and the hosts' agents alike; watchers and hosts are told a new
        interval at once."""
        before = job.pacer.current
        # Every rank or its batches' streams, and every host's agent whose heartbeats no batch carries.
        senders = job.state.senders() + job.ping_streams + job.hosts.streams - job.hosts.carried
        now = self.clock()
        pace = job.pacer.update(senders, now)
        # Silence that is the coordinator's own (its loop ran late, or every
        # replica's heartbeats queue on the way in) is not the replicas'.
        self.lag.window = max(self.lag.window, pace.timeout)
        if now - job.backlog_at >= BACKLOG_EVERY:  # a scan of every replica: not every tick
            job.backlog, job.backlog_at = backlog(job.state.heartbeat_ages(now), pace.interval), now
        timeout = pace.timeout + lag_allowance(max(self.lag.worst(now), job.backlog))
        members = len(job.state.quorum.members) if job.state.quorum else 0
        job.state.set_pace(timeout, settle_for(members, job.settings.rules.join_settle), pace.interval)
        if pace.interval != before.interval:
            log.info("job %s: heartbeat every %.3gs, timeout %.3gs (%d senders, budget %g/s)",
                     job.state.name, pace.interval, pace.timeout, senders, job.pacer.budget)
            job.notify()
            job.hosts.pace(pace.interval)

    def _log_lease_wait(self, job: ServedJob, decision: Decision) -> None:
        """One ``lease_wait`` event per wait: when it begins, and again only
        if it must wait for a replica it did not name before. Not once per
        reason text: the reason's summary of the job changes as replicas
        register or leave during the same wait."""
        quorum_id = job.state.quorum.id if job.state.quorum is not None else 0
        if not decision.leased or job.lease_wait[0] != quorum_id:
            job.lease_wait = (quorum_id, frozenset())
        if set(decision.leased) <= job.lease_wait[1]:
            return
        job.lease_wait = (quorum_id, job.lease_wait[1] | set(decision.leased))
        log.warning("job %s: %s", job.state.name, decision.reason,
                    extra={"event": "lease_wait", "job": job.state.name, "replicas": list(decision.leased)})
        job.logged_reason = decision.reason

    def _log_reason(self, job: ServedJob, reason: str) -> None:
        if reason != job.logged_reason:
            log.info("job %s: %s", job.state.name, reason)
            job.logged_reason = reason
