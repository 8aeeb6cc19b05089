"""The fault-tolerant step of one replica in a job: join, all-reduce, step boundary, leave.

``Manager`` (the script's API) drives it; it holds every part the step needs
and owns the order they run in:

* ``join``: catch up from a peer if behind, wait for admission, take a
  joiner's first step in the quorum (fthsdp/agent/training/catchup/joiner.py);
* ``reduce``: the step's fault-tolerant all-reduce (fthsdp/agent/training/ftar/allreduce.py),
  with a joiner's last gap closed inside it (fthsdp/agent/training/catchup/last_gap.py);
* ``apply``: the script's update on the step's sum, then the step
  boundary: the log a joiner replays, the checksum, a snapshot for a
  joiner, a switch to a growth quorum, a drain;
* ``leave``: the one way to stop.

Every rank of a replica group runs the same sequence: the decisions taken at
a boundary (drain, snapshot, growth switch) are agreed over the group first.
"""

from __future__ import annotations

import atexit
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.profiler import record_function

from fthsdp.agent import outcome
from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.catchup.join_session import JoinEnd, JoinSession, join_quorum
from fthsdp.agent.training.catchup.joiner import Joiner
from fthsdp.agent.training.catchup.last_gap import LastGap, require_state_held
from fthsdp.agent.training.catchup.replay import Replayer, combine_hex
from fthsdp.agent.training.catchup.report import CatchUpReport
from fthsdp.agent.training.catchup.source import ServedState
from fthsdp.agent.training.catchup.target import CatchUpTarget
from fthsdp.agent.training.checkpoint.restoring import resume_newest
from fthsdp.agent.training.config import ManagerConfig
from fthsdp.agent.training.ftar.allreduce import CONTROL_SLOTS, FTAR, StepResult, StepSum
from fthsdp.agent.training.ftar.buffer_pool import BufferPool
from fthsdp.agent.training.ftar.overlap import Overlap, Prelaunched
from fthsdp.agent.training.session.lifecycle import Ending, Lifecycle, ending_for_eviction
from fthsdp.agent.training.session.participation import Participation, participation
from fthsdp.agent.training.state.codec import local
from fthsdp.agent.training.state.train_state import TrainState, gradient_sample
from fthsdp.agent.training.step.background_checksum import PeriodicChecksums
from fthsdp.agent.training.step.buffer import StepBuffer
from fthsdp.agent.training.step.clock import StepClock
from fthsdp.agent.training.step.clocked_gap import ClockedGap
from fthsdp.agent.training.step.connection import JobConnection
from fthsdp.agent.training.step.eviction import EvictionWatch
from fthsdp.agent.training.step.script_hooks import ScriptHooks
from fthsdp.agent.training.transport import choose
from fthsdp.client import CoordinatorClient
from fthsdp.core.errors import Evicted, FtarError
from fthsdp.protos.v1 import catchup_pb2 as cpb
from fthsdp.protos.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from fthsdp.agent.training.checkpoint.saver import Saver
    from fthsdp.agent.training.checkpoint.seal import Sealed

log = logging.getLogger("fthsdp.agent.manager")


class ReplicaStep:
    def __init__(self, config: ManagerConfig, state: TrainState, replayer: Replayer, log_: GradientLog,
                 structure: int, lifecycle: Lifecycle, clock: StepClock, hooks: ScriptHooks,
                 group_timeout: float, buffers: BufferPool) -> None:
        """Open the replica's links to its job (fthsdp/agent/training/step/connection.py) and
        register; ``join`` then makes it a member."""
        self.config = config
        self._state = state
        self._replayer = replayer
        self._params = replayer.params
        self._log = log_
        self._structure = structure
        self._lifecycle = lifecycle
        self._clock = clock
        self._hooks = hooks
        self._source = ServedState(config.replica_id, config.shard_rank, structure, log_)
        """This rank's state as joiners copy it: snapshots and the log (served by the connection)."""
        transport = choose(config.cross_replica_backend, local(self._params[0]).device, config.host,
                           config.gloo_interface, config.cross_replica_groups)
        self._link = JobConnection(config, self._source, lifecycle, clock, group_timeout, transport)
        self._target = CatchUpTarget(state, replayer, self._link.reporting, self._link.leader, job=config.job,
                                     structure=structure)
        running = state.running
        self._overlap = Overlap(self._params, int(config.bucket_cap_mb * (1 << 20)),
                                tail=(running.numel() if running.carries else 0) + CONTROL_SLOTS, buffers=buffers)
        """Starts the step's all-reduce bucket by bucket during the backward pass
        (fthsdp/agent/training/ftar/overlap.py)."""
        self._buffers = buffers
        self._ftar = FTAR(self._link.view, config.job, shard_rank=config.shard_rank, timeout=config.timeout,
                          transport=transport, buckets=self._overlap.plan)
        self._ftar.groups.horizon = self._link.hangs.horizon
        self._join: JoinSession | None = None
        """A caught-up joiner until its first step in the quorum is committed: the source it holds and
        the last gap closed from it (set by ``join``, let go by the step boundary that commits it)."""
        self._checksums = PeriodicChecksums(config.checksum_every, self._link.reporting.publish, log_)
        """The periodic checksums, computed while the next step runs (step/background_checksum.py)."""
        self._checksum_wanted = False
        """A joiner took a snapshot at this boundary: the next one carries a checksum it checks its replay by."""
        self._proposal = 0
        """The growth quorum this replica group proposes to switch to (agreed by its ranks at commit)."""
        self._inputs: cpb.LogEntry | None = None
        """The recorded inputs of the step in progress (logged with its sum at commit)."""
        self._sentinel: torch.Tensor | None = None
        """A copy of the first gradient elements right after the all-reduce: checked at commit."""
        self._eviction: EvictionWatch | None = None
        """Ranks of a multi-rank group: learns that the coordinator took the group out."""
        self._saver: Saver | None = None
        """Periodic checkpoints (fthsdp/agent/training/checkpoint/saver.py); None: none configured."""
        if config.checkpoint_dir and not config.checkpoint_every.never:
            # Here, not at the top: torch.distributed.checkpoint loads only where checkpoints are written
            # (fthsdp/agent/training/checkpoint/errors.py).
            from fthsdp.agent.training.checkpoint.saver import Saver

            self._saver = Saver(Path(config.checkpoint_dir).resolve(), config.job, every=config.checkpoint_every,
                                keep=config.checkpoint_keep, seal_timeout=max(60.0, config.timeout),
                                on_sealed=self._sealed, now=time.monotonic())
        # A script that ends by an exception, never leaving, exits promptly too (groups.release).
        # Unregistered by leave(), which releases them itself: no handler, nor this step, outlives it.
        self._release_at_exit = atexit.register(lambda: self._ftar.groups.release(self._link.store))
        if config.resume:
            # Before registering: the coordinator must never see this replica at step 0.
            resume_newest(self._target, self._link.group, Path(config.checkpoint_dir), config.job, structure,
                          job_is_new=self._job_is_new)
        self._link.start_session()

    def _job_is_new(self) -> bool:
        """Whether the job has never formed a quorum (asked before this replica registers)."""
        cfg = self.config
        with CoordinatorClient(cfg.coordinator, timeout=cfg.timeout, token=cfg.token, tls=cfg.tls) as client:
            status = client.status(cfg.job)
        return not status.quorum.id and not status.committed_step

    @property
    def quorum_id(self) -> int:
        return self._link.view.newest_id()

    @property
    def checksum(self) -> str:
        self._checksums.settle()  # the newest periodic step's, as the script expects
        return self._link.reporting.current.state_checksum

    def participation(self) -> Participation:
        return participation(self._link.view, self._link.reporting.current.training_quorum_id, False)

    # ----- joining ---------------------------------------------------------------------

    def join(self, wait_for_replicas: int, admission_timeout: float) -> CatchUpReport | None:
        """Return once this replica is a member, at the step it trains next, or stopped
        (drained meanwhile, or the job finished before it came). Returns how it caught up (None: it was up to date)."""
        joiner = Joiner(
            self._target, job=self.config.job, replica_id=self.config.replica_id, structure=self._structure,
            group=self._link.group, view=self._link.view, reporting=self._link.reporting, lifecycle=self._lifecycle,
            connect=self._link.source_client)
        self._clock.working(pb.PHASE_STARTING, self._replayer.step)
        self._link.reporting.set_wait_for_replicas(wait_for_replicas)
        joined = join_quorum(joiner, admission_timeout, wait_for_replicas)
        if joined.end is JoinEnd.DRAINED:
            self.leave(Ending.DRAINED, joined.detail)
            return joined.report
        if joined.end is JoinEnd.JOB_FINISHED:  # nothing left to train: the script's loop ends and it exits 0
            log.warning("%s", joined.detail)  # the one line: "job default finished at step 500"
            self.leave(Ending.JOB_FINISHED, joined.detail)
            return joined.report
        self._admitted(admission_timeout)
        if joined.end is JoinEnd.CAUGHT_UP:
            self._join = JoinSession(joiner, LastGap(self._replayer, self._source, self.config.timeout,
                                                     self.config.replica_id, sources=joiner, moved=self._target.moved))
            self._first_step()
        if not self._lifecycle.stopped:
            self._lifecycle.joined()
            self._arm()
        self._clock.begin(self._replayer.step)
        return joined.report

    def _admitted(self, timeout: float) -> None:
        # Rank 0 saw the admission; the other ranks follow the same push on their own stream.
        quorum = self._link.view.wait_for_membership(timeout)
        self._link.reporting.publish(training_quorum_id=quorum.id)
        log.info("replica %s admitted in quorum %d at step %d", self.config.replica_id, quorum.id,
                 self._replayer.step)
        if self.config.shard_count > 1 and self._eviction is None:
            self._eviction = EvictionWatch(self._link.view, self.config.shard_rank,
                                           lambda: self._lifecycle.stopped, self._lifecycle.drain_event)

    def _first_step(self) -> None:
        """A joiner's first step in the quorum, taken inside ``start()`` so that
        the loop never sees its step jump. Its state has no gradient for the
        members' step (it has just replayed up to it, or a step or two short):
        it joins their all-reduce with zeros, replays what it still lacks
        while that runs, and applies their sum through ``update`` as a replay
        does. ``start()`` then returns at the members' next step, which this
        replica trains with them, with its own gradient."""
        result = self.reduce(contributes=False)
        if result is None:
            return  # drained as it joined
        if result.contributors == 0:
            # Every member was lost as this replica joined: it goes on alone
            # only if it reached their step (then the loop trains that step).
            require_state_held(self.config.replica_id, self._replayer.step, self._ftar.members_step)
            return
        self.apply(result, replayed=True)

    # ----- the step --------------------------------------------------------------------

    def reduce(self, contributes: bool) -> StepResult | None:
        """The step's fault-tolerant all-reduce; None if this replica was
        dropped from the quorum because it drains."""
        step = self._replayer.step
        if contributes:
            self._link.faults.at_step(step)  # an injected hang or slow step, in the step's compute time
        # From here on this replica, a member, waits for the others.
        self._clock.arrive(step)
        # The step's inputs, as a joiner will restore them before replaying its update.
        self._inputs = self._state.inputs(step)
        self._source.publish_inputs(self._inputs)
        gap = self._join.gap if self._join is not None else None
        if gap is not None:
            gap.taken = None
            self._checksums.settle()  # a joiner's replay inside the all-reduce changes the state
        prelaunched = self._overlap.complete()  # the buckets the backward pass did not start, started now
        if not contributes and prelaunched is not None:
            self._buffers.forget(prelaunched.buffer)
            prelaunched = None
        buffer = StepBuffer(self._params, self._state.running, contributes, self._buffers)
        if prelaunched is not None:
            buffer.fill_tail(prelaunched.buffer, prelaunched.gradients)
        proposal, self._proposal = self._proposal, 0
        try:
            result = self._ftar.allreduce(StepSum(
                step, prelaunched.buffer if prelaunched is not None else buffer.flatten(), self._structure,
                refill=buffer.flatten, contributes=contributes, prelaunched=prelaunched,
                proposal=proposal, control_slots=True, first_only=buffer.first_only,
                checkpoint=self._saver is not None and self._saver.clock_ran_out(time.monotonic()),
            ), joining=ClockedGap(gap, self._clock, self._replayer) if gap is not None else None)
        except Evicted as e:
            # Out of the quorum (dropped, drained, taken out as hung or unreachable): this
            # replica commits nothing of the step; the members that go on decide it among
            # themselves (fthsdp/agent/training/ftar/vote.py), so its not committing splits nothing.
            self._forget_except(None, prelaunched, buffer)
            ending = ending_for_eviction(self._link.drain_requested())
            self.leave(ending, "the quorum went on without it" if ending is Ending.DRAINED else str(e))
            if ending is Ending.DRAINED:
                return None
            raise
        if not contributes and self.config.shard_count > 1:
            # Every rank of the group must have joined at the same step (the
            # members switch every shard's group at one agreed step boundary).
            top, neg_bottom = self._link.group.max(result.step, -result.step)
            if top != -neg_bottom:
                raise FtarError(f"the ranks of replica {self.config.replica_id} joined the quorum at steps "
                                f"{-neg_bottom}..{top}")
        self._forget_except(result.total, prelaunched, buffer)
        buffer.restore()  # the result goes into the step's gradients
        if result.contributors == 0:  # the members were all lost as this joiner joined
            self._sentinel = None
            return result
        with record_function("fthsdp.gradients_back"):  # the phases of benchmarks/step_profile.py
            self._replayer.apply_sum(result.total, result.contributors)  # as a joiner's replay does
        if gap is not None and gap.taken is not None:
            self._inputs = gap.taken  # a joiner entered the members' step with their inputs
        if self._inputs.step != result.step:
            raise FtarError(f"internal: the inputs recorded are of step {self._inputs.step}, the sum of step "
                            f"{result.step}")
        if self._replayer.step != result.step:  # a joiner replays up to the members' step inside FTAR, not past
            raise FtarError(f"internal: the sum is of step {result.step}, the state at step {self._replayer.step}")
        self._sentinel = gradient_sample(self._params[0])
        # A snapshot taken at the last boundary must be copied before the update changes the state.
        with self._clock.section("snapshot copy", None):  # serving a joiner may take long: not a hang
            self._source.wait_copied(self.config.timeout)
        return result

    def apply(self, last: StepResult, replayed: bool) -> None:
        """The update on the step's sum, then the step boundary: the log,
        the checksum, a snapshot for a joiner, a growth switch, a drain."""
        self._clock.working(pb.PHASE_UPDATE, self._replayer.step)
        if not replayed:
            self._link.hold_for_lease()  # cut from the coordinator: commit nothing (session/lease.py)
        with record_function("fthsdp.checksum_settle"):
            self._checksums.settle()  # the update changes what the checksum in flight reads
        with record_function("fthsdp.update"):
            self._replayer.run_update(last.contributors, self._sentinel, replayed)
        step = self._replayer.step
        reporting, group = self._link.reporting, self._link.group
        reporting.publish(step=step, training_quorum_id=last.quorum_id)
        every = self.config.checksum_every
        periodic = bool(every) and step % every == 0
        inputs = self._inputs
        assert inputs is not None  # recorded by the step's all-reduce
        # Every rank of the group must stop, snapshot, save a checkpoint, or
        # propose a switch to a growth quorum at the same step boundary (the
        # ranks' proposals must be equal, so that every shard's group switches
        # at one step). A timed checkpoint: each rank's FTAR tells whether a
        # member of its shard's group asked; the max over the ranks is then
        # the same in every replica.
        proposal = self._ftar.growth_ready()
        by_count = self._saver is not None and self._saver.due(step)
        with record_function("fthsdp.group_max"):
            drain, snapshot, top, neg_bottom, checkpoint = group.max(
                int(self._link.drain_requested()), int(self._source.wanted), proposal, -proposal,
                int(by_count or last.checkpoint))
        self._proposal = top if top == -neg_bottom else 0
        checkpoint = checkpoint and self._saver is not None
        # A periodic checksum and a checkpoint's are computed while the next step
        # runs; one a joiner checks its replay by, or a multi-rank group's, now.
        wanted = periodic or self._checksum_wanted or checkpoint
        later = wanted and not self._checksum_wanted and group.size == 1
        with record_function("fthsdp.checksum"):
            parts = self._replayer.part_checksums(group) if wanted and not later else {}
        computed = combine_hex(parts) if parts else ""
        if periodic and not later:
            self._checksums.report(step, inputs.hyperparams_json, parts)
        self._checksum_wanted = False
        self._log.append(
            inputs, last.total, last.contributors, last.quorum_id, computed,
            json.dumps(parts, separators=(",", ":")) if parts else "",
        )
        checksum: str | Callable[[], str] = computed
        if later:
            checksum = self._checksums.start(step, inputs.step, inputs.hyperparams_json,
                                             self._state.part_checksums_later(), report=periodic)
        if snapshot:
            with self._clock.section("snapshot", None):
                self._source.take(step, self._state.capture())
            self._checksum_wanted = True  # the joiner checks its replay against the next step's checksum
        else:
            self._source.expire()  # a joiner that died without releasing its snapshot
        if checkpoint:
            with record_function("fthsdp.checkpoint"):
                self._save(step, last.quorum_id, checksum)
        if self._join is not None:
            self._join.finish()  # the first step in the quorum is committed: release the source
            self._join = None
        if drain:
            log.info("replica %s drains after step %d", self.config.replica_id, step)
            asked_by = self._lifecycle.drain_asked_by or "another rank"
            self.leave(Ending.DRAINED, f"drained after step {step} (asked by {asked_by})")
        else:
            self._arm()
        self._clock.begin(step)

    def _forget_except(self, kept: torch.Tensor | None, prelaunched: Prelaunched | None, buffer: StepBuffer) -> None:
        """The step's pooled buffers other than the one its sum is in (which the
        log hands back) are never reused: an abandoned collective may still write them."""
        lent = buffer.lent + ([prelaunched.buffer] if prelaunched is not None else [])
        for b in lent:
            if kept is None or b.data_ptr() != kept.data_ptr():
                self._buffers.forget(b)

    def _arm(self) -> None:
        """Let the next step's buckets start during its backward pass, if the
        group it runs in is known now (fthsdp/agent/training/ftar/overlap.py)."""
        group = self._ftar.groups.next_group()
        if group is not None:
            self._overlap.arm(group, group.pg)
        else:
            self._overlap.disarm()

    def _save(self, step: int, quorum_id: int, checksum: str | Callable[[], str]) -> None:
        """This member's share of the checkpoint of ``step``: every member of
        the quorum whose vote decided the step (``quorum_id``, fthsdp/agent/training/ftar/vote.py)
        writes one, by its place in it. A member only gets here with a step it
        committed, so its share is of that decision; one that committed the
        step in another quorum writes a share the sealer never merges with these."""
        from fthsdp.agent.training.checkpoint.share import ShareSpec  # loaded with the saver (__init__)

        assert self._saver is not None
        place = participation(self._link.view, quorum_id, False)
        spec = ShareSpec(self.config.job, step, self._structure, quorum_id, place.index, place.count,
                         self.config.shard_rank, self.config.shard_count, self._link.view.generation_of(quorum_id))
        with self._clock.section("checkpoint staging", None):
            self._saver.save(self._state.capture(), spec, checksum, now=time.monotonic())

    def _sealed(self, sealed: Sealed) -> None:
        """The saver's thread: a checkpoint this replica sealed is complete; the coordinator hears of it."""
        self._link.reporting.report_checkpoint(pb.CheckpointRecord(
            step=sealed.step, path=str(sealed.folder.absolute()), digest=sealed.digest, quorum_id=sealed.quorum_id,
            shares=sealed.shares, bytes=sealed.nbytes, sealed_unix_ms=int(time.time() * 1000),
            sealed_by=self.config.replica_id, state_checksum=sealed.state_checksum, kept=self.config.checkpoint_keep,
            generation=sealed.generation))

    def raise_if_evicted(self) -> None:
        """Another rank of this group died and the coordinator took the group
        out: this rank's state is lost with it (fthsdp/agent/training/step/eviction.py)."""
        watch = self._eviction
        # At commit() this drops a sum the step's vote decided: harmless, since the group is out
        # and its state is caught up again; the members that go on commit it (commit_vote.py).
        if watch is not None and watch.evicted and not self._link.drain_requested():
            watch.acknowledged.set()
            why = f"{watch.evicted}: its state must be caught up again (its agent restarts the group)"
            self.leave(Ending.EVICTED, why)
            raise Evicted(why)

    # ----- leaving ---------------------------------------------------------------------

    def leave(self, ending: Ending, detail: str) -> None:
        """The one way to STOPPED: tell the coordinator, let the catch-up server and the groups go."""
        if not self._lifecycle.stop(ending, detail):
            return
        if ending not in (Ending.FINISHED, Ending.JOB_FINISHED):
            log.info("replica %s stopped (%s): %s", self.config.replica_id, ending.value, detail)
        self._hooks.remove()
        self._overlap.close()
        try:
            self._checksums.settle()  # the last periodic step's checksum, reported before the session ends
        except Exception as e:  # noqa: BLE001 - leaving goes on; the checksum is only a report
            log.warning("replica %s: the state checksum of its last periodic step failed: %s",
                        self.config.replica_id, e)
        if self._saver is not None:
            self._saver.close(self.config.timeout)  # a share in flight is finished: the others may be sealing it
        self._link.close(leave_reason(ending, detail), failed=not ending.success)
        self._ftar.groups.release(self._link.store)  # so that the script exits normally, even past a hung peer
        atexit.unregister(self._release_at_exit)
        outcome.write(self.config.outcome_file, ending.value, detail)


def leave_reason(ending: Ending, detail: str) -> str:
    """What the coordinator records: the script's own words for a close, else the ending named first."""
    if ending in (Ending.FINISHED, Ending.FAILED) or detail.startswith(ending.value):
        return detail
    return f"{ending.value}: {detail}"
