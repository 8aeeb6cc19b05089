"""The coordinator's engine: job tables, the decision loop, the store, the push.

Everything here runs on one asyncio loop. Store calls are blocking (etcd
client) and go to worker threads, so an unreachable etcd delays quorum changes
but never heartbeats or status. A decision is written to the store with a
revision check *before* it is applied and pushed: a quorum id that reached a
replica is durable, so ids never go backwards after a restart.

This module is the engine's face: loading the jobs when this coordinator
starts to lead, and the replicas' and operators' calls. The loop that
decides runs on its own (fthsdp/coordinator/engine/decision_loop.py), and what is
read and written in the store for a job is in fthsdp/coordinator/engine/job_store.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine import checkpoints, committed, job_store
from fthsdp.coordinator.engine.decision_loop import DecisionLoop
from fthsdp.coordinator.engine.gauges import job_gauges
from fthsdp.coordinator.engine.loop_lag import PROBE_INTERVAL, LagWindow, probe
from fthsdp.coordinator.engine.metrics import TAKEN_OUT_REASONS, Metrics
from fthsdp.coordinator.engine.served_job import ServedJob
from fthsdp.coordinator.engine.takeover import take_over
from fthsdp.coordinator.hosts.status import group_statuses
from fthsdp.coordinator.job import identity
from fthsdp.coordinator.job.injection import InjectionBook
from fthsdp.coordinator.job.replica_entry import fail_awaited
from fthsdp.coordinator.job.watch_events import HEADER, SAME
from fthsdp.coordinator.ledger.writer import Guard, no_guard
from fthsdp.coordinator.store import Store
from fthsdp.core.errors import NotLeader, StaleSession, UnknownJob
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")


class CoordinatorRuntime:
    def __init__(
        self,
        config: CoordinatorConfig,
        store: Store,
        leader: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        guard: Guard = no_guard,
    ) -> None:
        """``guard``: the leader's key as this coordinator holds it, which
        every change of a job's ledger is conditioned on (none: a lone coordinator)."""
        self.config = config
        self.store = store
        self.leader = leader
        self.clock = clock
        self.wall = wall
        self.jobs = {name: ServedJob(name, config.job_settings(), store, guard) for name in config.job}
        self.injections = {name: InjectionBook() for name in config.job}
        """Faults operators injected, by job (fthsdp/coordinator/job/injection.py)."""
        self.metrics = Metrics()
        self.metrics.gauges = lambda: job_gauges(self.jobs.values(), self.lag, self.clock(), self.wall())
        for name in self.jobs:  # every series exists from the start, at 0
            for counter in (self.metrics.heartbeats, self.metrics.quorum_changes, self.metrics.epochs):
                counter.inc(0, job=name)
            for reason in TAKEN_OUT_REASONS:
                self.metrics.taken_out.inc(0, job=name, reason=reason)
        self._ticker: asyncio.Task | None = None
        self.lag = LagWindow(config.heartbeat_timeout, every=PROBE_INTERVAL)
        """The event loop's recent worst lag: added to the heartbeat timeout (fthsdp/coordinator/engine/loop_lag.py)."""
        self.decisions = DecisionLoop(config.tick_interval, self.jobs, self.metrics, self.lag, clock, wall)
        """Every job's decisions, each tick or when woken (fthsdp/coordinator/engine/decision_loop.py)."""
        self._prober: asyncio.Task | None = None
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
        self._ticker = asyncio.create_task(self.decisions.run(), name="fthsdp-quorum-tick")
        self._prober = asyncio.create_task(probe(self.lag, self.clock), name="fthsdp-loop-lag")

    async def stop(self) -> None:
        self.decisions.stopped = True
        self.leading = False
        for task in (self._ticker, self._prober):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    async def _load(self, job: ServedJob) -> None:
        """Take ``job`` over from the store (fthsdp/coordinator/engine/takeover.py)."""
        await take_over(job, self.leader, self.clock, self.wall)
        self.metrics.epochs.inc(job=job.state.name)

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
        self.decisions.wake()

    # ----- replica calls -------------------------------------------------------------

    async def register(self, req: pb.RegisterRequest) -> pb.RegisterResponse:
        job = self.job(req.job)
        stale = job.hosts.stale_incarnation(req.replica_id, req.restart_count)
        if stale:
            raise StaleSession(stale)
        async with job.lock:
            agents = tuple(sorted(set(req.agent_ids)))
            job.state.check_registration(req.replica_id, agents, req.step, req.quorum_id, self.clock(),
                                         req.restart_count)
            revision = None
            needed = job.state.record_needed(req.replica_id, req.address, req.world_size, agents, req.restart_count)
            if needed is not None:
                rec, expected = needed
                rec.registered_unix_ms = int(self.wall() * 1000)
                revision = await job_store.write_record(job, rec)
            session = job.state.register(
                req.replica_id, req.address, req.world_size, req.step, req.quorum_id, self.clock(), revision,
                tuple(req.catch_up_addresses), req.restart_count, req.wait_for_replicas, agents, req.incarnation,
                catch_up_fingerprints=tuple(req.catch_up_fingerprints),
            )
        log.info("job %s: replica %s registered (step %d, quorum %d)", job.state.name, req.replica_id, req.step,
                 req.quorum_id)
        if job.state.is_member(req.replica_id):
            self.wake()  # a restarted member must leave the quorum now
            # Or one back after a coordinator restart: its watchers (its other ranks) get their place.
            job.notify_replica(req.replica_id)
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

    def heartbeat(self, req: pb.HeartbeatRequest, batched: bool = False, counted: bool = True) -> pb.HeartbeatResponse:
        """``batched``: a rank's ping in its host's batch; ``counted``: False when the caller counts
        the heartbeats itself (``count_heartbeats``, once per batch)."""
        job = self.job(req.job)
        if counted:
            self.metrics.heartbeats.inc(job=job.state.name)
        if req.shard_rank > 0:  # a rank's liveness and progress, the bulk of them: nothing else to look at
            return job.state.rank_ping(req.replica_id, req.shard_rank, self.clock(),
                                       req.progress if req.HasField("progress") else None, req.left,
                                       req.incarnation, batched)
        entry = job.state.replicas.get(req.replica_id)
        was_ready = entry is not None and entry.incarnation.ready_since is not None
        recent = {c.step: c.checksum for c in req.recent_checksums}
        inputs = {c.step: c.inputs for c in req.recent_checksums if c.inputs}
        response = job.state.heartbeat(
            req.replica_id, req.session_id, req.step, req.ready, req.state_checksum, req.checksum_step, self.clock(),
            recent, req.shard_rank, (req.catch_up_bytes, req.catch_up_total_bytes), req.catching_up,
            req.progress if req.HasField("progress") else None, inputs, req.wait_for_replicas, req.left,
            req.lease_seq if req.ack else 0, req.incarnation, batched,
        )
        if req.shard_rank == 0 and req.HasField("checkpoint"):
            # The sealer's, once its session is known good (above), if it is of the job's lineage.
            why = (checkpoints.lineage_refusal(req.checkpoint, req.replica_id, job.state)
                   or identity.checkpoint_refusal(req.checkpoint, job.checkpoints.records))
            if not why:
                job.checkpoints.report(req.checkpoint)
            elif req.checkpoint.digest not in job.checkpoints.fenced:
                job.checkpoints.fenced.add(req.checkpoint.digest)
                log.warning("job %s: the checkpoint of step %d that %s reports is not recorded: %s (%s)",
                            job.state.name, req.checkpoint.step, req.replica_id, why, req.checkpoint.path,
                            extra={"event": "checkpoint_fenced", "job": job.state.name, "replica": req.replica_id,
                                   "step": req.checkpoint.step, "path": req.checkpoint.path, "reason": why})
        restoring = job.state.restore
        if req.shard_rank == 0 and req.refused_checkpoint and restoring is not None \
                and restoring.digest == req.refused_checkpoint:
            # Only the checkpoint being restored is refused so (catchup/joiner.py): a report about
            # any other speaks for no restore and drops nothing.
            self._refused(job, req.replica_id, req.refused_checkpoint, req.refused_checkpoint_reason)
        if req.shard_rank == 0 and req.ready != was_ready:
            self.wake()
        return response

    def batched_rank_ping(self, req: pb.HeartbeatRequest) -> None:
        """A rank's ping (shard rank above 0) in a batch: its liveness and progress, nothing answered, not
        counted (the caller counts the batch's: ``count_heartbeats``)."""
        self.job(req.job).state.rank_pinged(req.replica_id, req.shard_rank, self.clock(),
                                            req.progress if req.HasField("progress") else None, req.left,
                                            req.incarnation, batched=True)

    def batched_rank_digest(self, digest: pb.RankDigest) -> None:
        """``batched_rank_ping`` for each rank of a digest (checked: validation.check_rank_digest)."""
        self.job(digest.job).state.digest_pinged(digest, self.clock())

    def hosts_beat(self, job: str, hosts: Iterable[str]) -> None:
        """A ping batch speaks for ``hosts`` of ``job`` (PingBatch.hosts): each counts as a heartbeat on its
        Host stream."""
        table, now = self.job(job).hosts, self.clock()
        for host_id in hosts:
            table.beat(host_id, now, carried=True)

    def count_heartbeats(self, job: str, n: int) -> None:
        """``n`` heartbeats of ``job`` taken with ``counted=False``."""
        self.metrics.heartbeats.inc(n, job=self.job(job).state.name)

    def _refused(self, job: ServedJob, replica_id: str, digest: str, reason: str) -> None:
        """A replica could not restore a recorded checkpoint: drop it, so that a restore takes the one before."""
        record = job.checkpoints.refuse(digest)
        if record is None or digest in job.checkpoints.logged_refusals:
            return
        job.checkpoints.logged_refusals.add(digest)
        log.error("job %s: replica %s could not restore the checkpoint of step %d (%s): %s; it is dropped",
                  job.state.name, replica_id, record.step, record.path, reason,
                  extra={"event": "checkpoint_refused", "job": job.state.name, "replica": replica_id,
                         "step": record.step, "reason": reason})
        if job.state.restore is not None and job.state.restore.digest == digest:
            job.state.restore = None
            job.state.schedule.now()
            job.notify()
        self.wake()

    async def watch(self, req: pb.WatchRequest) -> AsyncIterator[bytes]:
        """The stream of serialized WatchEvents for one watcher: the quorum
        and the watched replica's place in it; the member list (once, then
        deltas) only to a watcher that asked and may see it
        (fthsdp/coordinator/job/watch_events.py)."""
        job = self.job(req.job)
        session = bool(req.replica_id and req.session_id)  # else an observer: its stream keeps nothing alive
        if session:
            job.state.watch_opened(req.replica_id, req.session_id)
        lists = not req.replica_id or req.member_list
        last, sent_quorum = None, 0  # sent_quorum: the quorum whose member list this stream holds
        last_own = b""  # the watcher's own fields in the last event sent
        own_changes = job.follow_replica(req.replica_id) if req.replica_id else None
        try:
            while True:
                seen = job.changes.generation
                seen_own = own_changes.generation if own_changes is not None else 0
                events = job.events
                current = events.quorum_id
                sees = lists and (not req.replica_id or job.state.is_member(req.replica_id))
                kind = events.kind_for(sees, sent_quorum)
                own = job.state.watch_event(req.replica_id, self.leader)
                own.heartbeat_interval_s = job.pacer.current.interval
                self.injections[job.state.name].add_to(own, job.state, req.replica_id)
                own_bytes = own.SerializeToString()
                event = events.event(kind, own_bytes)
                # A list holder that has the current quorum's list is sent it again (as an empty delta)
                # only with something of its own that changed: not on every notify after a change.
                unchanged = kind == SAME and own_bytes == last_own
                if event is not last and event != last and not unchanged:
                    yield event
                    last, last_own = event, own_bytes
                    sent_quorum = 0 if kind == HEADER else current
                if own_changes is None:
                    await job.changes.wait(seen)
                else:
                    woken = asyncio.get_running_loop().create_future()
                    job.changes.add(seen, woken)
                    own_changes.add(seen_own, woken)
                    await woken
        finally:
            if req.replica_id:
                job.unfollow_replica(req.replica_id)
            if session:
                job.state.watch_closed(req.replica_id, req.session_id, self.clock())
                self.wake()

    async def leave(self, req: pb.LeaveRequest) -> None:
        job = self.job(req.job)
        async with job.lock:
            gone = job.state.leave(req.replica_id, req.session_id, req.failed, self.clock(), req.reason, req.step)
            if gone:
                await job_store.delete_record(job, req.replica_id)
        log.info("job %s: replica %s left (%s)", job.state.name, req.replica_id, req.reason or "no reason given",
                 extra={"event": "replica_left", "job": job.state.name, "replica": req.replica_id,
                        "reason": req.reason, "failed": req.failed, "step": req.step})
        self.wake()

    def agent_event(self, req: pb.AgentEventRequest) -> None:
        job = self.job(req.job)
        now = self.clock()
        failed = job.state.agent_event(req.replica_id, req.state, req.restart_count, req.detail, now, req.agent_id)
        if not failed and fail_awaited(job.state.replicas.get(req.replica_id), req.state, now):
            job.state.schedule.now()
            failed = True
        state = pb.AgentState.Name(req.state).removeprefix("AGENT_STATE_").lower()
        log.info(
            "job %s: agent of %s (node %d): %s%s",
            job.state.name,
            req.replica_id,
            req.node_rank,
            state,
            f" ({req.detail})" if req.detail else "",
            extra={"event": "agent_reported", "job": job.state.name, "replica": req.replica_id,
                   "node_rank": req.node_rank, "state": state, "restart_count": req.restart_count,
                   "detail": req.detail},
        )
        if failed:
            self.wake()  # the decision drops it, and tells the watchers then
        # Nothing a watcher is sent comes from an agent's report: it wakes nobody (at 12,500 hosts every report
        # would otherwise be a push to every stream).

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
        stored = await job_store.stored_quorum(self.store, self.jobs[name].keys, name)
        if stored is not None:
            response.quorum.CopyFrom(stored)
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
        if job.checkpoints.records:
            response.checkpoint.CopyFrom(job.checkpoints.records[0])
        if job.committed.last_restore is not None:
            response.last_restore.CopyFrom(job.committed.last_restore)
        if job.state.finished is not None:
            response.finished.CopyFrom(job.state.finished)
        response.injections.extend(self.injections[job.state.name].recent)
        response.groups.extend(group_statuses(job.hosts, self.clock()))
        response.spares.extend(job.hosts.spares())
        return response

    def inject(self, req: pb.InjectRequest, peer: str) -> pb.InjectResponse:
        """Record a fault injection and push it to the replica's watchers (fthsdp/coordinator/job/injection.py)."""
        job = self.job(req.job)
        injection = self.injections[job.state.name].inject(job.state, req, peer, int(self.wall() * 1000))
        job.notify()
        return pb.InjectResponse(injection=injection)

    async def reopen_job(self, req: pb.ReopenJobRequest, peer: str) -> pb.ReopenJobResponse:
        """Reopen a job finished at exactly ``req.step`` (fthsdp/coordinator/engine/committed.py)."""
        job = self.job(req.job)
        async with job.lock:
            mark = await committed.reopen(job.committed, job.state, req, peer, self.wall)
        job.notify()
        self.wake()
        return pb.ReopenJobResponse(finished=mark)

    async def restore_checkpoint(self, req: pb.RestoreCheckpointRequest, peer: str) -> pb.RestoreCheckpointResponse:
        """Restore a job's lost state from its checkpoint of ``req.step`` (fthsdp/coordinator/engine/checkpoints.py)."""
        job = self.job(req.job)
        async with job.lock:
            restore = await checkpoints.restore_by_request(job.checkpoints, job.committed, job.state, req, peer,
                                                           self.clock(), self.wall)
        job.notify()
        self.wake()
        return pb.RestoreCheckpointResponse(restore=restore)

    async def give_up_state(self, req: pb.GiveUpStateRequest, peer: str) -> pb.GiveUpStateResponse:
        """Start a job over whose state is lost at exactly ``req.step`` (fthsdp/coordinator/engine/committed.py)."""
        job = self.job(req.job)
        async with job.lock:
            give_up = await committed.give_up(job.committed, job.state, req, peer, self.leader, job.epoch,
                                              self.clock(), self.wall)
        job.notify()
        self.wake()
        return pb.GiveUpStateResponse(give_up=give_up)

    async def set_flags(self, job_name: str, replica_id: str, *, cordoned=None, drain=None) -> None:
        job = self.job(job_name)
        async with job.lock:
            rec, _ = job.state.admin_record(replica_id, cordoned=cordoned, drain=drain)
            revision = await job_store.write_record(job, rec)
            job.state.apply_record(rec, revision)
        log.info("job %s: replica %s cordoned=%s drain=%s", job.state.name, replica_id, rec.cordoned,
                 rec.drain_requested)
        job.notify()
        self.wake()

    # ----- the decision loop ---------------------------------------------------------

    async def evaluate(self, job: ServedJob) -> None:
        """Decide for ``job`` now, as a tick does (fthsdp/coordinator/engine/decision_loop.py)."""
        await self.decisions.evaluate(job)
