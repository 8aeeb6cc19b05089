"""The coordinator's engine: job tables, the decision loop, the store, the push.

Everything here runs on one asyncio loop. Store calls are blocking (etcd
client) and go to worker threads, so an unreachable etcd delays quorum changes
but never heartbeats or status. A decision is written to the store with a
revision check *before* it is applied and pushed: a quorum id that reached a
replica is durable, so ids never go backwards after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from fthsdp.coordinator import committed
from fthsdp.coordinator.codec import decode, quorum_from_pb, quorum_to_pb
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.gauges import job_gauges
from fthsdp.coordinator.injection import InjectionBook
from fthsdp.coordinator.keys import JobKeys
from fthsdp.coordinator.loop_lag import LagWindow, backlog, lag_allowance, probe
from fthsdp.coordinator.metrics import TAKEN_OUT_REASONS, Metrics
from fthsdp.coordinator.quorum import Decision, Quorum, names, next_last_drop_id, settle_for
from fthsdp.coordinator.replica_entry import fail_awaited, grant_reconnect_grace
from fthsdp.coordinator.served_job import ServedJob
from fthsdp.coordinator.store import Store
from fthsdp.coordinator.watch_events import HEADER
from fthsdp.core.errors import LostOwnership, NotLeader, StoreError, StoreUnavailable, UnknownJob
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")

BACKLOG_EVERY = 0.5
"""Seconds between measurements of the heartbeat backlog."""

POLL_GAP_PER_COST = 19.0
"""An unsettled decision is taken again after this many times what it cost
(so polling takes at most a twentieth of the coordinator's time)."""


class CoordinatorRuntime:
    def __init__(
        self,
        config: CoordinatorConfig,
        store: Store,
        leader: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.leader = leader
        self.clock = clock
        self.wall = wall
        self.jobs = {name: ServedJob(name, config) for name in config.job}
        self.injections = {name: InjectionBook() for name in config.job}
        """Faults operators injected, by job (fthsdp/coordinator/injection.py)."""
        self.metrics = Metrics()
        self.metrics.gauges = lambda: job_gauges(self.jobs.values(), self.lag, self.clock())
        for name in self.jobs:  # every series exists from the start, at 0
            for counter in (self.metrics.heartbeats, self.metrics.quorum_changes, self.metrics.epochs):
                counter.inc(0, job=name)
            for reason in TAKEN_OUT_REASONS:
                self.metrics.taken_out.inc(0, job=name, reason=reason)
        self._wake = asyncio.Event()
        self._ticker: asyncio.Task | None = None
        self.lag = LagWindow(config.heartbeat_timeout)
        """The event loop's recent worst lag: added to the heartbeat timeout (fthsdp/coordinator/loop_lag.py)."""
        self._prober: asyncio.Task | None = None
        self._stopped = False
        self.leading = False
        """Whether this coordinator leads (``start()`` ran): only then does it serve replicas."""
        self.leader_hint = ""
        """The leader's address while this coordinator follows."""

    # ----- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Load every job from the store and start the decision loop."""
        for job in self.jobs.values():
            await self._load(job)
        self.leading = True
        self._ticker = asyncio.create_task(self._tick_loop(), name="fthsdp-quorum-tick")
        self._prober = asyncio.create_task(probe(self.lag, self.clock), name="fthsdp-loop-lag")

    async def stop(self) -> None:
        self._stopped = True
        self.leading = False
        for task in (self._ticker, self._prober):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    async def _load(self, job: ServedJob) -> None:
        keys = job.keys
        job.epoch = await asyncio.to_thread(self._bump_epoch, keys)
        stored = await asyncio.to_thread(self.store.get, keys.quorum)
        quorum, revision = None, 0
        if stored is not None:
            quorum = quorum_from_pb(decode(pb.Quorum, stored.value, f"quorum of job {job.state.name}"))
            revision = stored.revision
        records = {}
        for key, item in (await asyncio.to_thread(self.store.get_prefix, keys.replicas)).items():
            rec = decode(pb.ReplicaRecord, item.value, f"record {key}")
            records[rec.replica_id] = (rec, item.revision)
        committed_step = await asyncio.to_thread(job.committed.load, self.store, quorum)
        now = self.clock()
        job.state.load(quorum, revision, records, now, committed_step)
        self._grant_grace(job, now)
        job.state.finished = job.committed.finished
        self.metrics.epochs.inc(job=job.state.name)
        job.set_quorum(quorum_to_pb(quorum))
        if quorum is not None:
            job.remember(quorum)
        log.info(
            "job %s: epoch %d, quorum %s, committed step %d, %d known replicas (store %s)",
            job.state.name,
            job.epoch,
            f"{quorum.id} {list(quorum.member_ids)}" if quorum else "none",
            committed_step,
            len(records),
            self.store.description,
        )
        if job.state.finished is not None:
            log.info("job %s: finished at step %d (stored); no quorum forms until an operator reopens it",
                     job.state.name, job.state.finished.step)

    def _grant_grace(self, job: ServedJob, now: float) -> None:
        """Every replica from the store gets a grace to reconnect before it
        is judged (fthsdp/coordinator/quorum.py ``lost_at``): a restart or a failover
        silenced them all, and after a long outage their clients take a while
        to reconnect. It is what the rules would give silent members in any
        case: their heartbeat timeout, then the split-brain guard's
        join_timeout."""
        grace = self.config.heartbeat_timeout + self.config.join_timeout
        count = grant_reconnect_grace(job.state.replicas, now + grace)
        if count:
            log.info("job %s: %d replicas from the store; each has %gs to reconnect before it is judged "
                     "(sooner once every other member is back)", job.state.name, count, grace)

    def _bump_epoch(self, keys: JobKeys) -> int:
        while True:
            current = self.store.get(keys.epoch)
            previous = decode(pb.Epoch, current.value, "epoch").epoch if current else 0
            msg = pb.Epoch(epoch=previous + 1, coordinator=self.leader, started_unix_ms=int(self.wall() * 1000))
            result = self.store.compare_and_set(keys.epoch, msg.SerializeToString(), current.revision if current else 0)
            if result.succeeded:
                return msg.epoch

    # ----- lookups -------------------------------------------------------------------

    def job(self, name: str) -> ServedJob:
        if not self.leading:
            raise NotLeader(f"this coordinator follows {self.leader_hint or 'the leader'}; ask the leader")
        if not name and len(self.jobs) == 1:
            return next(iter(self.jobs.values()))
        job = self.jobs.get(name)
        if job is None:
            raise UnknownJob(f"unknown job {name!r}; this coordinator serves: {', '.join(sorted(self.jobs))}")
        return job

    def wake(self) -> None:
        self._wake.set()

    # ----- replica calls -------------------------------------------------------------

    async def register(self, req: pb.RegisterRequest) -> pb.RegisterResponse:
        job = self.job(req.job)
        async with job.lock:
            revision = None
            needed = job.state.record_needed(req.replica_id, req.address, req.world_size)
            if needed is not None:
                rec, expected = needed
                rec.registered_unix_ms = int(self.wall() * 1000)
                revision = await self._write_record(job, rec, expected)
            session = job.state.register(
                req.replica_id, req.address, req.world_size, req.step, req.quorum_id, self.clock(), revision,
                tuple(req.catch_up_addresses), req.restart_count,
            )
        log.info("job %s: replica %s registered (step %d, quorum %d)", job.state.name, req.replica_id, req.step,
                 req.quorum_id)
        if job.state.is_member(req.replica_id):
            self.wake()  # a restarted member must leave the quorum now
        # Anyone else is looked at on the next tick: a job starting registers
        # thousands at once, and a decision per registration would starve them.
        response = pb.RegisterResponse(
            session_id=session,
            heartbeat_interval_s=job.pacer.current.interval,
            heartbeat_timeout_s=job.pacer.current.timeout,
            leader=self.leader,
        )
        if job.events.header is not None:
            response.quorum.CopyFrom(job.events.header)  # the members come on Watch
        return response

    def heartbeat(self, req: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        job = self.job(req.job)
        entry = job.state.replicas.get(req.replica_id)
        was_ready = entry is not None and entry.ready_since is not None
        recent = {c.step: c.checksum for c in req.recent_checksums}
        inputs = {c.step: c.inputs for c in req.recent_checksums if c.inputs}
        self.metrics.heartbeats.inc(job=job.state.name)
        response = job.state.heartbeat(
            req.replica_id, req.session_id, req.step, req.ready, req.state_checksum, req.checksum_step, self.clock(),
            recent, req.shard_rank, (req.catch_up_bytes, req.catch_up_total_bytes), req.catching_up,
            req.progress if req.HasField("progress") else None, inputs,
        )
        if req.shard_rank == 0 and req.ready != was_ready:
            self.wake()
        return response

    async def watch(self, req: pb.WatchRequest) -> AsyncIterator[bytes]:
        """The stream of serialized WatchEvents for one watcher: the quorum
        and the watched replica's place in it; the member list (once, then
        deltas) only to a watcher that asked and may see it
        (fthsdp/coordinator/watch_events.py)."""
        job = self.job(req.job)
        session = bool(req.replica_id and req.session_id)  # else an observer: its stream keeps nothing alive
        if session:
            job.state.watch_opened(req.replica_id, req.session_id)
        lists = not req.replica_id or req.member_list
        last, sent_quorum = None, 0  # sent_quorum: the quorum whose member list this stream holds
        try:
            while True:
                seen = job.changes.generation
                events = job.events
                current = events.quorum_id
                sees = lists and (not req.replica_id or job.state.is_member(req.replica_id))
                kind = events.kind_for(sees, sent_quorum)
                own = job.state.watch_event(req.replica_id, self.leader)
                own.heartbeat_interval_s = job.pacer.current.interval
                self.injections[job.state.name].add_to(own, job.state, req.replica_id)
                event = events.event(kind, own.SerializeToString())
                if event is not last and event != last:
                    yield event
                    last = event
                    sent_quorum = 0 if kind == HEADER else current
                await job.changes.wait(seen)
        finally:
            if session:
                job.state.watch_closed(req.replica_id, req.session_id, self.clock())
                self.wake()

    async def leave(self, req: pb.LeaveRequest) -> None:
        job = self.job(req.job)
        async with job.lock:
            entry = job.state.replicas.get(req.replica_id)
            revision = entry.record_revision if entry is not None else 0
            gone = job.state.leave(req.replica_id, req.session_id, req.failed, self.clock(), req.reason, req.step)
            if gone and revision:
                await self._store(self.store.compare_and_delete, job.keys.replica(req.replica_id), revision)
        log.info("job %s: replica %s left (%s)", job.state.name, req.replica_id, req.reason or "no reason given")
        self.wake()

    def agent_event(self, req: pb.AgentEventRequest) -> None:
        job = self.job(req.job)
        now = self.clock()
        failed = job.state.agent_event(req.replica_id, req.state, req.restart_count, req.detail, now)
        if not failed and fail_awaited(job.state.replicas.get(req.replica_id), req.state, now):
            job.state.dirty = failed = True
        log.info(
            "job %s: agent of %s (node %d): %s%s",
            job.state.name,
            req.replica_id,
            req.node_rank,
            pb.AgentState.Name(req.state).removeprefix("AGENT_STATE_").lower(),
            f" ({req.detail})" if req.detail else "",
        )
        if failed:
            self.wake()
        job.notify()

    # ----- status and admin ----------------------------------------------------------

    async def follower_status(self, req: pb.StatusRequest) -> pb.StatusResponse:
        """A follower's answer: who leads, and the quorum as stored."""
        name = req.job or (next(iter(self.jobs)) if len(self.jobs) == 1 else "")
        if name not in self.jobs:
            raise UnknownJob(f"unknown job {name!r}; this coordinator serves: {', '.join(sorted(self.jobs))}")
        response = pb.StatusResponse(
            job=name, leader=self.leader_hint, follower=True, jobs=sorted(self.jobs),
            reason=f"this coordinator follows {self.leader_hint or 'nobody yet'}",
        )
        stored = await self._store(self.store.get, JobKeys(self.config.store_prefix, name).quorum)
        if stored is not None:
            response.quorum.CopyFrom(decode(pb.Quorum, stored.value, f"quorum of job {name}"))
        return response

    def status(self, req: pb.StatusRequest) -> pb.StatusResponse:
        job = self.job(req.job)
        response = pb.StatusResponse(
            job=job.state.name,
            leader=self.leader,
            epoch=job.epoch,
            replicas=job.state.replica_statuses(self.clock()),
            reason=job.state.reason,
            jobs=sorted(self.jobs),
            committed_step=job.state.committed_step,
            state_lost_step=job.state.state_lost_step,
            state_lost_reason=job.state.state_lost,
            hang_limit_s=job.state.progress.limit,
            median_step_time_s=job.state.progress.median_step,
        )
        if job.quorum_pb is not None:
            response.quorum.CopyFrom(job.quorum_pb)
        if job.committed.last_give_up is not None:
            response.last_give_up.CopyFrom(job.committed.last_give_up)
        if job.state.finished is not None:
            response.finished.CopyFrom(job.state.finished)
        response.injections.extend(self.injections[job.state.name].recent)
        return response

    def inject(self, req: pb.InjectRequest, peer: str) -> pb.InjectResponse:
        """Record a fault injection and push it to the replica's watchers (fthsdp/coordinator/injection.py)."""
        job = self.job(req.job)
        injection = self.injections[job.state.name].inject(job.state, req, peer, int(self.wall() * 1000))
        job.notify()
        return pb.InjectResponse(injection=injection)

    async def reopen_job(self, req: pb.ReopenJobRequest, peer: str) -> pb.ReopenJobResponse:
        """Reopen a job finished at exactly ``req.step`` (fthsdp/coordinator/committed.py)."""
        job = self.job(req.job)
        async with job.lock:
            mark = await committed.reopen(job.committed, self.store, job.state, req, peer, self.wall)
        job.notify()
        self.wake()
        return pb.ReopenJobResponse(finished=mark)

    async def give_up_state(self, req: pb.GiveUpStateRequest, peer: str) -> pb.GiveUpStateResponse:
        """Start a job over whose state is lost at exactly ``req.step`` (fthsdp/coordinator/committed.py)."""
        job = self.job(req.job)
        async with job.lock:
            give_up = await committed.give_up(job.committed, self.store, job.state, req, peer, self.leader,
                                              job.epoch, self.clock(), self.wall)
        job.notify()
        self.wake()
        return pb.GiveUpStateResponse(give_up=give_up)

    async def set_flags(self, job_name: str, replica_id: str, *, cordoned=None, drain=None) -> None:
        job = self.job(job_name)
        async with job.lock:
            rec, expected = job.state.admin_record(replica_id, cordoned=cordoned, drain=drain)
            revision = await self._write_record(job, rec, expected)
            job.state.apply_record(rec, revision)
        log.info("job %s: replica %s cordoned=%s drain=%s", job.state.name, replica_id, rec.cordoned,
                 rec.drain_requested)
        job.notify()
        self.wake()

    async def _write_record(self, job: ServedJob, rec: pb.ReplicaRecord, expected: int) -> int:
        key = job.keys.replica(rec.replica_id)
        result = await self._store(self.store.compare_and_set, key, rec.SerializeToString(), expected)
        if not result.succeeded:
            # Someone else (an earlier coordinator, an operator) wrote it; keep
            # their flags, which are the newer intent, and write ours over them.
            current = decode(pb.ReplicaRecord, result.current.value, key) if result.current else None
            if current is not None:
                rec.cordoned = rec.cordoned or current.cordoned
                rec.drain_requested = rec.drain_requested or current.drain_requested
            retry_expected = result.current.revision if result.current else 0
            result = await self._store(self.store.compare_and_set, key, rec.SerializeToString(), retry_expected)
            if not result.succeeded:
                raise LostOwnership(f"record {key} keeps changing under this coordinator")
        return result.current.revision

    async def _store(self, fn, *args):
        return await asyncio.to_thread(fn, *args)

    # ----- the decision loop ---------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.tick_interval)
            except TimeoutError:
                pass
            self._wake.clear()
            for job in self.jobs.values():
                try:
                    await self.evaluate(job)
                    # After the decision and its push, outside the job's lock (fthsdp/coordinator/committed.py).
                    await committed.sync(job.committed, self.store, job.state, self.clock(), int(self.wall() * 1000))
                except Exception:  # the loop must survive anything one job does
                    log.exception("job %s: quorum evaluation failed", job.state.name)

    async def evaluate(self, job: ServedJob) -> None:
        async with job.lock:
            if self._stopped:
                return
            for rid, verdict in job.state.check_checksums().items():
                log.warning("job %s: replica %s's state checksum disagrees at step %d: %s; %s", job.state.name, rid,
                            verdict.step, verdict.reason,
                            "its agent gives up" if verdict.give_up else "it is taken out and must catch up",
                            extra={"event": "checksum_mismatch", "job": job.state.name, "replica": rid,
                                   "step": verdict.step, "reason": verdict.reason, "strikes": verdict.strikes,
                                   "give_up": verdict.give_up})
            await self._take_out_hung(job)
            await self._store_marks(job)
            self._pace(job)
            due = job.state.needs_decision(self.clock())
            self._notice_silent_outsiders(job)
            if not due:
                return
            began, now = time.perf_counter(), self.clock()
            decision = job.state.evaluate(now)
            # Polling an unsettled decision (joiners arriving) takes at most
            # a twentieth of the loop; anything urgent (a member lost) marks the
            # job dirty and is decided on the next tick regardless.
            job.state.poll_at = now + POLL_GAP_PER_COST * (time.perf_counter() - began)
            mark = job.state.finish_mark(decision, int(self.wall() * 1000))
            if mark is not None:
                # Stored before anything is applied or pushed: a coordinator
                # restart must still know, and a late arrival never be admitted.
                try:
                    await committed.mark_finished(job.committed, self.store, job.state, mark, self.clock())
                except (StoreError, LostOwnership) as e:
                    pending = f"the job finished at step {mark.step}; storing that is pending ({e})"
                    self._log_reason(job, pending)
                    job.state.reason, job.state.dirty = pending, True
                    return
                decision = job.state.finish(mark, decision)
                log.info("job %s: finished at step %d: every member of quorum %d left, finished; no quorum forms "
                         "until an operator reopens it", job.state.name, mark.step, mark.quorum_id,
                         extra={"event": "job_finished", "job": job.state.name, "step": mark.step,
                                "quorum_id": mark.quorum_id})
            quorum, revision = None, job.state.quorum_revision
            if not decision.changes_quorum:
                job.change_since = None
            else:
                if job.change_since is None:
                    job.change_since = self.clock()
                try:
                    quorum, revision = await self._publish(job, decision)
                except StoreUnavailable as e:
                    pending = f"quorum change pending, the store is unavailable ({e}): {decision.reason}"
                    self._log_reason(job, pending)
                    job.state.reason = pending
                    return
                except LostOwnership as e:
                    log.error("job %s: %s", job.state.name, e)
                    return
            before, lost_before, step_before = job.state.catch_up, job.state.state_lost_step, job.state.committed_step
            job.state.apply(decision, quorum, revision)
            if quorum is not None:
                job.set_quorum(quorum_to_pb(quorum))
                self.metrics.quorum_changes.inc(job=job.state.name)
                assert job.change_since is not None  # set above when the change began (under the job's lock)
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
            self._log_reason(job, decision.reason)
            # A new reason alone wakes nobody: at 10,000 watchers every push
            # counts; each event carries the latest reason anyway. A state
            # loss does: the replicas must know why they wait.
            ended = step_before if decision.state_ended and mark is None else 0
            if (committed.report_transition(job.state, lost_before, ended) or quorum is not None
                    or before != job.state.catch_up or mark is not None):
                job.notify()

    async def _take_out_hung(self, job: ServedJob) -> None:
        """Members that others waited for past the hang limit, and stragglers
        (cordoned first, in the store, so that they are not admitted again)."""
        hung, stragglers = job.state.check_progress(self.clock())
        for rid, why in hung.items():
            log.error("job %s: replica %s taken out: %s", job.state.name, rid, why,
                      extra={"event": "hang", "job": job.state.name, "replica": rid, "reason": why})
            self.metrics.taken_out.inc(job=job.state.name, reason="hung")
        for rid, why in stragglers.items():
            try:
                rec, expected = job.state.admin_record(rid, cordoned=True)
                job.state.apply_record(rec, await self._write_record(job, rec, expected))
            except (StoreUnavailable, LostOwnership) as e:
                log.warning("job %s: straggler %s not taken out, it could not be cordoned: %s", job.state.name, rid, e)
                continue
            job.state.mark_hung(rid, why, self.clock())
            log.error("job %s: replica %s taken out: %s", job.state.name, rid, why,
                      extra={"event": "straggler", "job": job.state.name, "replica": rid, "reason": why})
            self.metrics.taken_out.inc(job=job.state.name, reason="straggler")
        if job.state.horizon_moved:
            job.notify()  # replicas waiting in the all-reduce wait this long for a verdict

    async def _store_marks(self, job: ServedJob) -> None:
        """Store the unreachable marks set or cleared since the last tick,
        before the quorum that takes the replica out is published: a
        coordinator that starts next keeps a still-cut replica out."""
        for rec, expected in job.state.mark_records():
            try:
                job.state.apply_record(rec, await self._write_record(job, rec, expected))
            except (StoreUnavailable, LostOwnership) as e:
                job.state.marks_to_store.add(rec.replica_id)  # again on the next tick
                log.warning("job %s: replica %s's unreachable mark is not stored yet: %s", job.state.name,
                            rec.replica_id, e)

    def _notice_silent_outsiders(self, job: ServedJob) -> None:
        """A stopped joiner's agent is told to end it, as a stopped member's is (fthsdp/coordinator/silence.py)."""
        noticed = job.state.notice_silent_outsiders(self.clock())
        for rid, why in noticed.items():
            log.error("job %s: replica %s must be ended: %s", job.state.name, rid, why,
                      extra={"event": "silent", "job": job.state.name, "replica": rid, "reason": why})
            self.metrics.taken_out.inc(job=job.state.name, reason="silent")
        if noticed:
            job.notify()

    def _pace(self, job: ServedJob) -> None:
        """Stretch the heartbeat interval (and timeout) to the budget; watchers
        are told a new interval at once."""
        before = job.pacer.current
        senders = job.state.senders()
        now = self.clock()
        pace = job.pacer.update(senders, now)
        # Silence that is the coordinator's own (its loop ran late, or every
        # replica's heartbeats queue on the way in) is not the replicas'.
        self.lag.window = max(self.lag.window, pace.timeout)
        if now - job.backlog_at >= BACKLOG_EVERY:  # a scan of every replica: not every tick
            job.backlog, job.backlog_at = backlog(job.state.heartbeat_ages(now), pace.interval), now
        timeout = pace.timeout + lag_allowance(max(self.lag.worst(now), job.backlog))
        members = len(job.state.quorum.members) if job.state.quorum else 0
        job.state.set_pace(timeout, settle_for(members, self.config.join_settle))
        if pace.interval != before.interval:
            log.info("job %s: heartbeat every %.3gs, timeout %.3gs (%d senders, budget %g/s)",
                     job.state.name, pace.interval, pace.timeout, senders, self.config.heartbeat_budget)
            job.notify()

    async def _publish(self, job: ServedJob, decision: Decision) -> tuple[Quorum, int]:
        prev = job.state.quorum
        members = decision.members or ()
        new_id = (prev.id if prev else 0) + 1
        quorum = Quorum(
            id=new_id,
            members=members,
            # Members that stay keep the step they were admitted at.
            step=max([decision.head_step, *(m.step for m in members)]),
            created_unix_ms=int(self.wall() * 1000),
            reason=decision.reason,
            epoch=job.epoch,
            # A regroup drops nobody, but its members must leave the old group at once.
            last_drop_id=new_id if decision.regroup else next_last_drop_id(prev, new_id, members),
        )
        data = quorum_to_pb(quorum).SerializeToString()
        result = await self._store(self.store.compare_and_set, job.keys.quorum, data, job.state.quorum_revision)
        if result.succeeded:
            return quorum, result.current.revision
        # Another writer moved the quorum on: adopt theirs so our next id is
        # above it, and decide again on the next tick.
        if result.current is not None:
            theirs = quorum_from_pb(decode(pb.Quorum, result.current.value, "quorum"))
            job.state.set_quorum(theirs, result.current.revision)
            job.set_quorum(quorum_to_pb(theirs))
            job.notify()
        raise LostOwnership(f"quorum of job {job.state.name} was changed by another coordinator; re-deciding")

    def _log_reason(self, job: ServedJob, reason: str) -> None:
        if reason != job.logged_reason:
            log.info("job %s: %s", job.state.name, reason)
            job.logged_reason = reason


