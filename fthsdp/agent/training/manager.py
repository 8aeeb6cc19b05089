"""The training-script API: the fault-tolerant step of one replica.

A nanoGPT-style loop stays readable::

    def update():                      # what turns averaged gradients into the next state
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    ft = Manager.from_env(model, optimizer, update=update, state={"scheduler": scheduler, "scaler": scaler})
    ft.start()
    while ft.step < max_steps and not ft.stopped:
        x, y = get_batch(ft.step, ft.replica_rank)   # data position = (step, replica rank)
        scaler.scale(model(x, y)).backward()
        ft.allreduce_gradients()   # FTAR across the quorum; redone among survivors on a failure
        ft.commit()                # runs update(), then the step boundary: membership changes, checksum, drain
    ft.close()

The manager registers the replica with the coordinator, learns every
membership change from its push (no coordinator call on a step where nothing
changed) and hosts the rendezvous store of the quorums it is the first member
of. A SIGTERM, or ``fthsdp drain``, makes the replica leave at the next step
boundary; ``stopped`` then turns true and the script should exit 0. Data
sharding by ``(step, replica_rank)`` or by ``participation()``:
fthsdp/agent/training/participation.py. A replica that starts behind the quorum catches up
from a peer inside ``start()`` (fthsdp/agent/training/joiner.py) and replays the steps it
missed through the same ``update`` (fthsdp/agent/training/replay.py; the contract that makes
that bit-identical: fthsdp/agent/training/train_state.py). Where each process is in its step
goes to the coordinator, which takes out a replica that others wait for past
the hang limit (fthsdp/agent/training/step_clock.py, fthsdp/coordinator/hang.py).
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import signal
import ssl
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from fthsdp.agent import outcome
from fthsdp.agent.injection import RankFaults
from fthsdp.agent.standby import wait_for_activation
from fthsdp.agent.training import catchup_tls
from fthsdp.agent.training.catchup_client import SourceClient
from fthsdp.agent.training.catchup_server import CatchUpServer
from fthsdp.agent.training.catchup_source import CatchUpSource
from fthsdp.agent.training.checksum import StridedHistory, structure_hash
from fthsdp.agent.training.eviction import EvictionWatch
from fthsdp.agent.training.ftar import FTAR, QuorumTracker, StepResult
from fthsdp.agent.training.grad_log import GradientLog
from fthsdp.agent.training.hang_notice import HangNotices
from fthsdp.agent.training.job_finished import JobFinished
from fthsdp.agent.training.joiner import CatchUpReport, Drained, Joiner
from fthsdp.agent.training.last_gap import LastGap, require_state_held
from fthsdp.agent.training.lifecycle import Ending, Lifecycle, ending_for_eviction
from fthsdp.agent.training.manager_config import ManagerConfig
from fthsdp.agent.training.membership import Membership
from fthsdp.agent.training.participation import Participation, QuorumRecord
from fthsdp.agent.training.reach_probe import ReachProbes
from fthsdp.agent.training.replay import Replayer, combine_hex
from fthsdp.agent.training.replica_group import ReplicaGroup
from fthsdp.agent.training.step_buffer import StepBuffer
from fthsdp.agent.training.step_clock import StepClock
from fthsdp.agent.training.train_state import (
    TrainState,
    check_gradient,
    default_update,
    gradient_sample,
    step_outside_update,
)
from fthsdp.core.credentials import TlsFiles
from fthsdp.core.errors import ApiMisuse, ConfigError, Evicted, FtarError, FthsdpError, StateNotHeld
from fthsdp.protos.v1 import catchup_pb2 as cpb
from fthsdp.protos.v1 import coordinator_pb2 as pb

__all__ = ["ApiMisuse", "Manager", "ManagerConfig", "Participation", "StateNotHeld"]

log = logging.getLogger("fthsdp.agent.manager")

_SignalHandler = Callable[[int, FrameType | None], Any] | int | None
"""What ``signal.signal`` returns: a function, SIG_DFL/SIG_IGN, or None (set outside Python)."""


class Manager:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: ManagerConfig,
        update: Callable[[], object] | None = None,
        state: Mapping[str, object] | None = None,
    ) -> None:
        """``update``: the step's update, run by ``commit()`` and replayed by
        a joiner (default: ``optimizer.step()`` then ``zero_grad``); ``state``:
        what travels with the model and optimizer, by name (anything with
        ``state_dict()``/``load_state_dict()``). See fthsdp/agent/training/train_state.py."""
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self._state = TrainState(model, optimizer, state)
        self._update = update if update is not None else default_update(optimizer)
        if not callable(self._update):
            raise ConfigError(f"update must be a function of no arguments, got a {type(self._update).__name__}")
        self._lifecycle = Lifecycle()
        """Starting, training or stopped, and how it stopped (fthsdp/agent/training/lifecycle.py)."""
        self._last: StepResult | None = None
        self._params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        self._structure = structure_hash(model)
        self._reduced = False
        self._history = StridedHistory(config.checksum_every)
        self._replica_group: ReplicaGroup | None = None
        self._log = GradientLog(config.catch_up_log_steps, config.catch_up_log_bytes)
        self._replayer = Replayer(self._state, self._params, self._update, self._log)
        self._source = CatchUpSource(config.replica_id, config.shard_rank, self._structure, self._log)
        self._server: CatchUpServer | None = None
        self._joiner: Joiner | None = None
        self._checksum_wanted = False
        self._admission_timeout = 120.0
        self.catch_up: CatchUpReport | None = None
        """How this replica caught up in ``start()``; None if it started up to date."""
        self._leader = config.shard_rank == 0
        """Rank 0 of the replica group holds its session with the coordinator."""
        self._address = ""
        """The rendezvous store of every quorum whose first member this group is (rank 0; from ``start()``)."""
        self._store: dist.TCPStore | None = None
        self._tracker = QuorumTracker(config.replica_id)
        self._source_tls: ssl.SSLContext | None = None  # the catch-up client's TLS context, made on first use
        self._catch_up_tls = config.tls if config.catch_up_tls else TlsFiles()
        self._membership: Membership | None = None
        """The replica's registration with the coordinator (from ``start()``)."""
        self._quorums = QuorumRecord(config.replica_id)
        self._ftar = FTAR(self._tracker, config.job, shard_rank=config.shard_rank, timeout=config.timeout,
                         host=config.host, interface=config.gloo_interface)
        self._proposal = 0
        """The growth quorum this replica group proposes to switch to (agreed by its ranks at commit)."""
        self._inputs: cpb.LogEntry | None = None
        """The recorded inputs of the step in progress (logged with its sum at commit)."""
        self._gap = LastGap(self._replayer, self._source, config.timeout, config.replica_id,
                           client=lambda: self._joiner.gap_client() if self._joiner is not None else None,
                           moved=self._moved,
                           switch=lambda: self._joiner.switch_source() if self._joiner is not None else None)
        """Closes a joiner's last gap inside FTAR (fthsdp/agent/training/last_gap.py)."""
        self._sentinel: torch.Tensor | None = None
        """A copy of the first gradient elements right after the all-reduce: checked at commit."""
        self._step_hook: RemovableHandle | None = None
        self._sigterm: _SignalHandler | None = None
        """The script's SIGTERM handler that ``start()`` replaced (a drain while this replica trains)."""
        self._eviction: EvictionWatch | None = None
        """Ranks of a multi-rank group: learns that the coordinator took the group out."""
        self._clock = StepClock()
        """Where this process is in its step, for the coordinator's hang verdicts
        (fthsdp/agent/training/step_clock.py)."""
        self._hangs = HangNotices(config.replica_id, config.shard_rank, config.restart_count)
        self._faults = RankFaults(config.replica_id, config.shard_rank, config.restart_count)
        """Injected hang and slow faults (`fthsdp inject`; fthsdp/agent/injection.py)."""

    @property
    def step(self) -> int:
        """The step this replica's state is at: the next step to train. ``start()``
        returns at the step this replica trains next as a member (a joiner has
        taken its first step in the quorum by then); from there every committed
        iteration advances it by exactly one, so a loop that counts its own
        iterations stays in step with it."""
        return self._replayer.step

    @property
    def _session(self) -> Membership:
        """The replica's registration with the coordinator: set by ``start()``
        before anything that uses it runs (never, standalone)."""
        assert self._membership is not None, "internal: the coordinator session is used before start()"
        return self._membership

    @property
    def _group(self) -> ReplicaGroup:
        """The replica group's own ranks: set by ``start()``."""
        assert self._replica_group is not None, "internal: the replica group is used before start()"
        return self._replica_group

    @property
    def stopped(self) -> bool:
        """True once this replica left the job (drained, finished, taken out:
        ``lifecycle.ending``); the loop should end, and the script exit 0."""
        return self._lifecycle.stopped

    @property
    def contributors(self) -> int:
        """Inside ``update``: how many replicas' gradients the step being
        applied averaged (live or replayed), e.g. to count samples trained."""
        return self._replayer.contributors

    @property
    def replaying(self) -> bool:
        """True while ``update`` runs for a replayed step (skip logging there, say)."""
        return self._replayer.replaying

    @classmethod
    def from_env(
        cls, model, optimizer, env: Mapping[str, str] | None = None, *, update=None, state=None, **overrides
    ) -> Manager:
        """The manager configured by `fthsdp agent`. In a warm standby (``fthsdp
        agent --standby``) this waits until the agent activates it."""
        env = os.environ if env is None else env
        wait_for_activation(env)
        return cls(model, optimizer, ManagerConfig.from_env(env, **overrides), update=update, state=state)

    @property
    def replica_rank(self) -> int:
        return self.config.replica_rank

    @property
    def num_replicas(self) -> int:
        return self.config.num_replicas

    @property
    def replica_id(self) -> str:
        return self.config.replica_id

    @property
    def quorum_id(self) -> int:
        """The newest quorum this replica knows of (0 before the first)."""
        return self._tracker.newest_id()

    def participation(self) -> Participation:
        """This replica's ``index`` among the ``count`` replicas whose gradients
        the next ``allreduce_gradients()`` is expected to average, the same on
        every member (fthsdp/agent/training/participation.py). A failure during the step may
        leave fewer (``StepResult.contributors``); a joiner's first step has none of its."""
        if self._replica_group is None:
            raise ApiMisuse("participation() before start(): the replica is in no quorum yet")
        if self._membership is None:  # standalone
            return Participation(0, 1)
        return self._quorums.participation(self._membership.training_quorum_id, False)

    # ----- lifecycle -----------------------------------------------------------------

    def _source_client(self, address: str) -> SourceClient:
        """A connection to a catch-up source, with this job's token (and TLS
        when this replica has a certificate: fthsdp/agent/training/catchup_tls.py)."""
        if self._source_tls is None and catchup_tls.uses_tls(self._catch_up_tls):
            self._source_tls = catchup_tls.client_context(self._catch_up_tls)
        return SourceClient(address, self.config.token, timeout=self.config.timeout, tls=self._source_tls)

    def start(self, wait_for_replicas: int = 1, admission_timeout: float = 120.0) -> None:
        """Register, and return once this replica is a member of the quorum, at
        the step it trains next: for a fresh job, once a quorum of
        ``wait_for_replicas`` members includes it (a fresh job passes its
        replica count so that every replica starts at step 0 together); for a
        replica behind the quorum, once it caught up from a peer, was admitted,
        and took its first step in the quorum (without a gradient of its own:
        the members never wait for this replica's forward pass). A drain asked
        for meanwhile, or a job that finished before this replica came, returns
        with ``stopped`` true."""
        if self.config.shard_count > 1 and not dist.is_initialized():
            raise ConfigError(
                f"this replica group has {self.config.shard_count} ranks: call torch.distributed.init_process_group() "
                "(the group's own world, for FSDP) before Manager.start()"
            )
        if threading.current_thread() is threading.main_thread():
            # A drain, until the replica stops; then the script's own handler again (``_leave``).
            previous = signal.signal(signal.SIGTERM, lambda *_: self._lifecycle.request_drain("SIGTERM"))
            self._sigterm = signal.SIG_DFL if previous is None else previous  # None: set outside Python
        cfg = self.config
        if cfg.standalone:
            self._start_standalone()
            return
        timeout = datetime.timedelta(seconds=cfg.timeout)
        if self._leader:
            # The rendezvous store of every quorum whose first member we are.
            self._store = dist.TCPStore(cfg.host, 0, is_master=True, timeout=timeout, wait_for_workers=False)
            self._address = f"{cfg.host}:{self._store.port}"
        self._membership = Membership(
            cfg.coordinator, cfg.job, cfg.replica_id, self._address or "unused:0", cfg.shard_count, 0,
            token=cfg.token, tls=cfg.tls,
        )
        # First: a drain is known before the quorum that no longer includes this replica.
        self._membership.add_listener(self._on_event)
        self._membership.add_listener(self._tracker.update)
        self._membership.add_listener(self._quorums.record)
        self._membership.add_listener(self._hangs)
        self._membership.add_listener(self._faults)
        self._membership.add_listener(ReachProbes(cfg.replica_id, cfg.shard_rank, self._membership.report_reach))
        self._membership.progress, self._membership.restart_count = self._clock.progress, cfg.restart_count
        self._ftar.groups.horizon = self._hangs.horizon
        self._replica_group = ReplicaGroup(cfg.shard_rank, cfg.shard_count, max(cfg.timeout, admission_timeout))
        tls = catchup_tls.server_context(self._catch_up_tls)
        self._server = CatchUpServer(self._source, cfg.host, token=cfg.token, max_rate=cfg.catch_up_max_rate,
                                     tls=tls).start()
        self._membership.catch_up_addresses = self._replica_group.all_gather_strings(self._server.address)
        self._step_hook = self.optimizer.register_step_pre_hook(self._guard_step)
        # A script that ends by an exception exits promptly too.
        atexit.register(lambda: self._ftar.groups.release(self._store))
        if self._leader:
            self._membership.start()
        else:
            self._membership.observe(cfg.shard_rank)
        self._admission_timeout = admission_timeout
        self._joiner = Joiner(self, job=cfg.job, replica_id=cfg.replica_id, structure=self._structure,
                              group=self._group, membership=self._membership, lifecycle=self._lifecycle,
                              connect=self._source_client)
        self._clock.working(pb.PHASE_STARTING, self.step)
        try:
            self._joiner.run(admission_timeout, min_members=wait_for_replicas, until_admitted=True)
        except Drained as e:
            self.catch_up = self._joiner.report
            self._joiner.finish()
            self._leave(Ending.DRAINED, str(e))
            return
        except JobFinished as e:  # nothing left to train: the script's loop ends and it exits 0
            log.warning("%s", e)  # the one line: "job default finished at step 500"
            self.catch_up = self._joiner.report
            self._joiner.finish()
            self._leave(Ending.JOB_FINISHED, str(e))
            return
        self.catch_up = self._joiner.report
        self._admitted()
        if self._joiner is not None:
            self._join()
        if not self.stopped:
            self._lifecycle.joined()
        self._clock.begin(self.step)

    def _start_standalone(self) -> None:
        """No `fthsdp agent`, no coordinator: one replica on its own, at step 0."""
        if self._leader:
            log.warning("fthsdp: FTHSDP_REPLICA_ID is not set (not run by `fthsdp agent`): training as one "
                        "standalone replica, with no coordinator and no fault tolerance")
        self._replica_group = ReplicaGroup(self.config.shard_rank, self.config.shard_count, self.config.timeout)
        self._step_hook = self.optimizer.register_step_pre_hook(self._guard_step)
        self._lifecycle.joined()
        self._clock.begin(self.step)

    def section(self, name: str, timeout: float | None = None):
        """``with ft.section("eval"):`` marks work that may take long (evaluation, a checkpoint): the
        coordinator then allows ``timeout`` seconds (default: its --section-timeout), not the hang limit."""
        return self._clock.section(name, timeout)

    def _on_event(self, event: pb.WatchEvent) -> None:
        """The coordinator's push (its watch thread): a drain asked there (`fthsdp drain`, the admin endpoint)."""
        if event.drain_requested:
            self._lifecycle.request_drain("the coordinator")

    def _drain_requested(self) -> bool:
        latest = self._membership.latest if self._membership is not None else None
        return self._lifecycle.drain_requested or (latest is not None and latest.drain_requested)

    def _admitted(self) -> None:
        if self._joiner is not None and not self._joiner.source_address:
            self._joiner = None  # admitted as up to date: no source to let go of
        # Rank 0 saw the admission; the other ranks follow the same push on their own stream.
        quorum = self._tracker.wait_for_membership(self._admission_timeout)
        self._session.training_quorum_id = quorum.id
        log.info("replica %s admitted in quorum %d at step %d", self.config.replica_id, quorum.id, self.step)
        if self.config.shard_count > 1 and self._eviction is None:
            self._eviction = EvictionWatch(self._tracker, self.config.shard_rank, lambda: self.stopped,
                                           self._lifecycle.drain_event)

    def _join(self) -> None:
        """A joiner's first step in the quorum, taken inside ``start()`` so that
        the loop never sees its step jump. Its state has no gradient for the
        members' step (it has just replayed up to it, or a step or two short):
        it joins their all-reduce with zeros, replays what it still lacks
        while that runs, and applies their sum through ``update`` as a replay
        does. ``start()`` then returns at the members' next step, which this
        replica trains with them, with its own gradient."""
        result = self._reduce(contributes=False)
        if result is None:
            return  # drained as it joined
        if result.contributors == 0:
            # Every member was lost as this replica joined: it goes on alone
            # only if it reached their step (then the loop trains that step).
            require_state_held(self.replica_id, self.step, self._ftar.members_step)
            return
        self._apply(result, replayed=True)

    def close(self, reason: str = "finished", failed: bool = False) -> None:
        """Leave the job (the others go on without this replica) and stop;
        ``failed``: it leaves because the script failed (the coordinator
        then counts it lost, not finished)."""
        self._leave(Ending.FAILED if failed else Ending.DRAINED if reason == "drained" else Ending.FINISHED, reason)

    def _leave(self, ending: Ending, detail: str) -> None:
        """The one way to STOPPED: tell the coordinator, let the catch-up server and the groups go."""
        if not self._lifecycle.stop(ending, detail):
            return
        if ending not in (Ending.FINISHED, Ending.JOB_FINISHED):
            log.info("replica %s stopped (%s): %s", self.config.replica_id, ending.value, detail)
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        self._restore_sigterm()
        if self._membership is not None:
            try:
                self._membership.leave(_leave_reason(ending, detail), failed=not ending.success)
            except FthsdpError as e:
                log.warning("could not tell the coordinator that this replica leaves: %s", e)
                self._membership.close()
        if self._server is not None:
            self._server.close()
        self._ftar.groups.release(self._store)  # so that the script exits normally, even past a hung peer
        outcome.write(self.config.outcome_file, ending.value, detail)

    def _restore_sigterm(self) -> None:
        """Give SIGTERM back to the script's own handler (only the main thread may)."""
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None

    def _guard_step(self, optimizer, args, kwargs) -> None:
        """An optimizer step pre-hook: a step outside the update is one a joiner would not replay."""
        if not self._replayer.in_update and not self.stopped:
            raise step_outside_update()

    def __enter__(self) -> Manager:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close("finished")
        else:
            self.close(f"failed: {exc[1]}", failed=True)

    # ----- the step ------------------------------------------------------------------

    def allreduce_gradients(self) -> StepResult | None:
        """Replace every gradient by its average over the quorum's replicas.

        With FSDP (HSDP), each rank all-reduces its own gradient shards with
        the same rank of the other replica groups. Returns None, leaving the
        gradients alone, once this replica has left the quorum (drained:
        ``stopped`` is then true). Never moves ``step``: the sum is always
        the one of the step this replica trains.
        """
        if self.stopped:
            return None
        self._raise_if_evicted()
        if self._reduced:
            raise ApiMisuse("allreduce_gradients() called twice in one step; call commit() to end the step")
        if self._replica_group is None:
            raise ApiMisuse("allreduce_gradients() before start()")
        step = self.step
        self._faults.at_step(step)  # an injected hang or slow step, in the step's compute time
        result = self._reduce(contributes=True)
        if result is None:
            return None
        if result.step != step:
            raise FtarError(f"internal: replica {self.replica_id} trained step {step} but the quorum summed step "
                            f"{result.step}")
        self._reduced = True
        self._last = result
        return result

    def _reduce(self, contributes: bool) -> StepResult | None:
        """The step's fault-tolerant all-reduce (fthsdp/agent/training/ftar.py); None if this
        replica was dropped from the quorum because it drains."""
        if self.config.standalone:
            # Alone: the average over one replica is its own gradient.
            self._sentinel = gradient_sample(self._params[0])
            return StepResult(torch.empty(0), contributors=1, quorum_id=0, abandoned=0, step=self.step)
        # From here on this replica, a member, waits for the others.
        self._clock.arrive(self.step)
        # The step's inputs, as a joiner will restore them before replaying its update.
        self._inputs = self._state.inputs(self.step)
        self._source.publish_inputs(self._inputs)
        self._gap.taken = None
        buffer = StepBuffer(self._params, self._state.running, contributes)
        proposal, self._proposal = self._proposal, 0
        try:
            result = self._ftar.allreduce(
                self.step, buffer.flatten(), self._structure, refill=buffer.flatten, contributes=contributes,
                proposal=proposal, control_slots=True, idle=self._gap.while_waiting, serve=self._serve,
                first_only=buffer.first_only,
            )
        except Evicted as e:
            ending = ending_for_eviction(self._drain_requested())
            self._leave(ending, "the quorum went on without it" if ending is Ending.DRAINED else str(e))
            if ending is Ending.DRAINED:
                return None
            raise
        if not contributes and self.config.shard_count > 1:
            # Every rank of the group must have joined at the same step (the
            # members switch every shard's group at one agreed step boundary).
            top, neg_bottom = self._group.max(result.step, -result.step)
            if top != -neg_bottom:
                raise FtarError(f"the ranks of replica {self.replica_id} joined the quorum at steps "
                                f"{-neg_bottom}..{top}")
        buffer.restore()  # the result goes into the step's gradients
        if result.contributors == 0:  # the members were all lost as this joiner joined
            self._sentinel = None
            return result
        self._replayer.apply_sum(result.total, result.contributors)  # as a joiner's replay does
        if self._gap.taken is not None:
            self._inputs = self._gap.taken  # a joiner entered the members' step with their inputs
        if self._inputs.step != result.step:
            raise FtarError(f"internal: the inputs recorded are of step {self._inputs.step}, the sum of step "
                            f"{result.step}")
        self._replayer.step = result.step  # a joiner replayed up to the members' step inside FTAR
        self._sentinel = gradient_sample(self._params[0])
        # A snapshot taken at the last boundary must be copied before the update changes the state.
        with self._clock.section("snapshot copy", None):  # serving a joiner may take long: not a hang
            self._source.wait_copied(self.config.timeout)
        return result

    def commit(self) -> bool:
        """Run the step's update on the averaged gradients, then mark the step
        boundary (``step`` advances by one). Returns True when the step was
        committed, False only when this replica has left the job (``stopped``
        is then true: the loop ends). The loop never runs a step again: a
        member lost mid-step is handled inside ``allreduce_gradients()``,
        which redoes the all-reduce among the survivors."""
        if self.stopped:
            return False
        if not self._reduced:
            raise ApiMisuse("commit() before allreduce_gradients(): every step must all-reduce its gradients first")
        self._raise_if_evicted()
        self._reduced = False
        assert self._last is not None  # set with _reduced
        self._apply(self._last, replayed=False)
        return True

    def _apply(self, last: StepResult, replayed: bool) -> None:
        """The update on the step's sum, then the step boundary: the log,
        the checksum, a snapshot for a joiner, a growth switch, a drain."""
        self._clock.working(pb.PHASE_UPDATE, self.step)
        check_gradient(self._params[0], self._sentinel)
        with self._replayer.updating(last.contributors, replay=replayed):
            self._update()
        self._replayer.step += 1
        m = self._membership
        if m is None:  # standalone: no log, checksum, snapshot or growth; a SIGTERM still drains
            if self._drain_requested():
                self._leave(Ending.DRAINED, f"drained after step {self.step} (asked by SIGTERM)")
            self._clock.begin(self.step)
            return
        m.step = self.step
        m.training_quorum_id = last.quorum_id
        every = self.config.checksum_every
        periodic = bool(every) and self.step % every == 0
        inputs = self._inputs
        assert inputs is not None  # recorded by the step's all-reduce
        parts = self._replayer.part_checksums(self._group) if periodic or self._checksum_wanted else {}
        checksum = combine_hex(parts) if parts else ""
        if periodic:
            m.state_checksum, m.checksum_step = checksum, self.step
            m.recent_checksums = self._history.record(self.step, checksum, inputs.hyperparams_json)
        self._checksum_wanted = False
        self._log.append(
            inputs, last.total, last.contributors, last.quorum_id, checksum,
            json.dumps(parts, separators=(",", ":")) if parts else "",
        )
        # Every rank of the group must stop, snapshot, or propose a switch to
        # a growth quorum at the same step boundary (the ranks' proposals
        # must be equal, so that every shard's group switches at one step).
        proposal = self._ftar.growth_ready()
        drain, snapshot, top, neg_bottom = self._group.max(int(self._drain_requested()), int(self._source.wanted),
                                                          proposal, -proposal)
        self._proposal = top if top == -neg_bottom else 0
        if snapshot:
            with self._clock.section("snapshot", None):
                self._source.take(self.step, self._state.capture())
            self._checksum_wanted = True  # the joiner checks its replay against the next step's checksum
        else:
            self._source.expire()  # a joiner that died without releasing its snapshot
        if self._joiner is not None:
            self._joiner.finish()  # the first step in the quorum is committed: release the source
            self._joiner = None
        if drain:
            log.info("replica %s drains after step %d", self.config.replica_id, self.step)
            asked_by = self._lifecycle.drain_asked_by or "another rank"
            self._leave(Ending.DRAINED, f"drained after step {self.step} (asked by {asked_by})")
        self._clock.begin(self.step)

    def _serve(self, request):
        """FTAR's requests of a joiner (fthsdp/agent/training/last_gap.py): its own work, not a wait for the others."""
        self._clock.working(pb.PHASE_UPDATE, self.step)
        try:
            return self._gap.serve(request)
        finally:
            self._clock.arrive(self.step)

    def _raise_if_evicted(self) -> None:
        """Another rank of this group died and the coordinator took the group
        out: this rank's state is lost with it (fthsdp/agent/training/eviction.py)."""
        watch = self._eviction
        if watch is not None and watch.evicted and not self._drain_requested():
            watch.acknowledged.set()
            why = f"{watch.evicted}: its state must be caught up again (its agent restarts the group)"
            self._leave(Ending.EVICTED, why)
            raise Evicted(why)

    # ----- catch-up (joiner.py, replay.py, last_gap.py): the state a joiner brings to the members' ---------

    def load_snapshot(self, state: dict, step: int) -> None:
        self._state.load(state)
        self._replayer.step = self._session.step = step

    def verify(self, entry: cpb.LogEntry, group: ReplicaGroup) -> bool:
        """Check the state after a replayed step against the source's checksum."""
        return self._replayer.verify(entry, group)

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        """Apply one logged step, exactly as the members did."""
        self._replayer.replay(entry, total)
        self._moved()

    def _moved(self) -> None:
        """The state's step moved by a replay: heartbeats report it."""
        if self._membership is not None:
            self._membership.step = self.step

    def report_progress(self, done: int, total: int) -> None:
        if self._leader:
            self._session.catch_up_progress = (done, total)

    @property
    def checksum(self) -> str:
        """The last periodic state checksum reported ("" before the first)."""
        return self._membership.state_checksum if self._membership is not None else ""


def _leave_reason(ending: Ending, detail: str) -> str:
    """What the coordinator records: the script's own words for a close, else the ending named first."""
    if ending in (Ending.FINISHED, Ending.FAILED) or detail.startswith(ending.value):
        return detail
    return f"{ending.value}: {detail}"
