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
agent/participation.py. A replica that starts behind the quorum catches up
from a peer inside ``start()`` (agent/joiner.py) and replays the steps it
missed through the same ``update`` (agent/replay.py; the contract that makes
that bit-identical: agent/train_state.py). Where each process is in its step
goes to the coordinator, which takes out a replica that others wait for past
the hang limit (agent/step_clock.py, coordinator/hang.py).
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from agent import catchup_tls
from agent.catchup_client import SourceClient
from agent.catchup_server import CatchUpServer
from agent.catchup_source import CatchUpSource
from agent.checksum import StridedHistory, structure_hash
from agent.ftar import CONTROL_SLOTS, FTAR, Evicted, FtarError, QuorumTracker, StepResult
from agent.last_gap import LastGap, StateNotHeld, require_state_held
from agent.grad_log import GradientLog
from agent.hang_notice import HangNotices
from agent.joiner import CatchUpReport, Joiner
from agent.manager_config import ManagerConfig
from agent.membership import Membership
from agent.eviction import EvictionWatch
from agent.participation import Participation, QuorumRecord
from agent.replay import Replayer, combine_hex
from agent.replica_group import ReplicaGroup
from agent.standby import wait_for_activation
from agent.step_clock import StepClock
from agent.state_codec import local as _local
from agent.train_state import ApiMisuse, TrainState, check_dense, check_gradient, default_update, gradient_sample
from agent.train_state import step_outside_update
from coordinator.credentials import TlsFiles
from coordinator.errors import ConfigError, FthsdpError
from protos.fthsdp.v1 import catchup_pb2 as cpb
from protos.fthsdp.v1 import coordinator_pb2 as pb

__all__ = ["ApiMisuse", "Manager", "ManagerConfig", "Participation", "StateNotHeld"]

log = logging.getLogger("fthsdp.agent.manager")


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
        ``state_dict()``/``load_state_dict()``). See agent/train_state.py."""
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.state = TrainState(model, optimizer, state)
        self._update = update if update is not None else default_update(optimizer)
        if not callable(self._update):
            raise ConfigError(f"update must be a function of no arguments, got a {type(self._update).__name__}")
        self.stopped = False
        self.last: StepResult | None = None
        self._params = [p for p in model.parameters() if p.requires_grad]
        self.structure = structure_hash(model)
        self._reduced = False
        self._history = StridedHistory(config.checksum_every)
        self._drain = threading.Event()
        self.group: ReplicaGroup | None = None
        self.log = GradientLog(config.catch_up_log_steps, config.catch_up_log_bytes)
        self.replayer = Replayer(self.state, self._params, self._update, self.log)
        self.source = CatchUpSource(config.replica_id, config.shard_rank, self.structure, self.log)
        self._server: CatchUpServer | None = None
        self._joiner: Joiner | None = None
        self._checksum_wanted = False
        self._following = False
        self._admission_timeout = 120.0
        self.catch_up: CatchUpReport | None = None
        """How this replica caught up in ``start()``; None if it started up to date."""
        self.leader = config.shard_rank == 0
        """Rank 0 of the replica group holds its session with the coordinator."""
        self.address = ""
        """The rendezvous store of every quorum whose first member this group is (rank 0; from ``start()``)."""
        self._store: dist.TCPStore | None = None
        self.tracker = QuorumTracker(config.replica_id)
        self._source_tls = None  # the catch-up client's TLS context, made on first use
        self._catch_up_tls = config.tls if config.catch_up_tls else TlsFiles()
        self.membership: Membership | None = None
        """The replica's registration with the coordinator (from ``start()``)."""
        self._quorums = QuorumRecord(config.replica_id)
        self.ftar = FTAR(self.tracker, config.job, shard_rank=config.shard_rank, timeout=config.timeout)
        self._proposal = 0
        """The growth quorum this replica group proposes to switch to (agreed by its ranks at commit)."""
        self._inputs: cpb.LogEntry | None = None
        """The recorded inputs of the step in progress (logged with its sum at commit)."""
        self.gap = LastGap(self.replayer, self.source, config.timeout, config.replica_id,
                           client=lambda: self._joiner.gap_client() if self._joiner is not None else None,
                           moved=self._moved)
        """Closes a joiner's last gap inside FTAR (agent/last_gap.py)."""
        self._sentinel: torch.Tensor | None = None
        """A copy of the first gradient elements right after the all-reduce: checked at commit."""
        self._step_hook = None
        self._eviction: EvictionWatch | None = None
        """Ranks of a multi-rank group: learns that the coordinator took the group out."""
        self.clock = StepClock()
        """Where this process is in its step, for the coordinator's hang verdicts (agent/step_clock.py)."""
        self.hangs = HangNotices(config.replica_id, config.shard_rank, config.restart_count)

    @property
    def step(self) -> int:
        """The step this replica's state is at: the next step to train."""
        return self.replayer.step

    @step.setter
    def step(self, value: int) -> None:
        self.replayer.step = value

    @property
    def contributors(self) -> int:
        """Inside ``update``: how many replicas' gradients the step being
        applied averaged (live or replayed), e.g. to count samples trained."""
        return self.replayer.contributors

    @property
    def replaying(self) -> bool:
        """True while ``update`` runs for a replayed step (skip logging there, say)."""
        return self.replayer.replaying

    @classmethod
    def from_env(
        cls, model, optimizer, env: Mapping[str, str] | None = None, *, update=None, state=None, **overrides
    ) -> "Manager":
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
        return self.tracker.newest_id()

    def participation(self) -> Participation:
        """This replica's ``index`` among the ``count`` replicas whose gradients
        the next ``allreduce_gradients()`` is expected to average, the same on
        every member (agent/participation.py). A failure during the step may
        leave fewer (``StepResult.contributors``); a joiner's first step has none of its."""
        if self.group is None:
            raise ApiMisuse("participation() before start(): the replica is in no quorum yet")
        return self._quorums.participation(self.membership.training_quorum_id, self._following)

    # ----- lifecycle -----------------------------------------------------------------

    def source_client(self, address: str) -> SourceClient:
        """A connection to a catch-up source, with this job's token (and TLS
        when this replica has a certificate: agent/catchup_tls.py)."""
        if self._source_tls is None and catchup_tls.uses_tls(self._catch_up_tls):
            self._source_tls = catchup_tls.client_context(self._catch_up_tls)
        return SourceClient(address, self.config.token, timeout=self.config.timeout, tls=self._source_tls)

    def start(self, wait_for_replicas: int = 1, admission_timeout: float = 120.0) -> None:
        """Register, and return once this replica can train: for a fresh job,
        once a quorum of ``wait_for_replicas`` members includes it (a fresh
        job passes its replica count so that every replica starts at step 0
        together); for a replica behind the quorum, once it caught up from a
        peer and asked to join. Its first ``allreduce_gradients()`` then waits
        for the admission, replaying the steps the members take meanwhile, so
        that the members never wait for this replica's forward pass."""
        if self.config.shard_count > 1 and not dist.is_initialized():
            raise ConfigError(
                f"this replica group has {self.config.shard_count} ranks: call torch.distributed.init_process_group() "
                "(the group's own world, for FSDP) before Manager.start()"
            )
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self._drain.set())
        cfg = self.config
        timeout = datetime.timedelta(seconds=cfg.timeout)
        if self.leader:
            # The rendezvous store of every quorum whose first member we are.
            self._store = dist.TCPStore(cfg.host, 0, is_master=True, timeout=timeout, wait_for_workers=False)
            self.address = f"{cfg.host}:{self._store.port}"
        self.membership = Membership(
            cfg.coordinator, cfg.job, cfg.replica_id, self.address or "unused:0", cfg.shard_count, 0,
            token=cfg.token, tls=cfg.tls,
        )
        self.membership.add_listener(self.tracker.update)
        self.membership.add_listener(self._quorums.record)
        self.membership.add_listener(self.hangs)
        self.membership.progress, self.membership.restart_count = self.clock.progress, cfg.restart_count
        self.ftar.groups.horizon = self.hangs.horizon
        self.group = ReplicaGroup(cfg.shard_rank, cfg.shard_count, max(cfg.timeout, admission_timeout))
        tls = catchup_tls.server_context(self._catch_up_tls)
        self._server = CatchUpServer(self.source, cfg.host, token=cfg.token, max_rate=cfg.catch_up_max_rate, tls=tls).start()
        self.membership.catch_up_addresses = self.group.all_gather_strings(self._server.address)
        self._step_hook = self.optimizer.register_step_pre_hook(self._guard_step)
        atexit.register(self.ftar.groups.release)  # a script that ends by an exception exits promptly too
        if self.leader:
            self.membership.start()
        else:
            self.membership.observe(cfg.shard_rank)
        self._admission_timeout = admission_timeout
        self._joiner = Joiner(self)
        admitted = self._joiner.run(time.monotonic() + admission_timeout, min_members=wait_for_replicas)
        self.catch_up = self._joiner.report
        if admitted:
            self._admitted()
        else:
            self._following = True
            log.info("replica %s caught up to step %d; joining at its first all-reduce", cfg.replica_id, self.step)
        self.clock.begin(self.step)

    def section(self, name: str, timeout: float | None = None):
        """``with ft.section("eval"):`` marks work that may take long (evaluation, a checkpoint): the
        coordinator then allows ``timeout`` seconds (default: its --section-timeout), not the hang limit."""
        return self.clock.section(name, timeout)

    def _admitted(self) -> None:
        if self._joiner is not None and not self._joiner.source_address:
            self._joiner = None  # admitted as up to date: no source to let go of
        # Rank 0 saw the admission; the other ranks follow the same push on their own stream.
        quorum = self.tracker.wait_for_membership(self._admission_timeout)
        self.membership.training_quorum_id = quorum.id
        log.info("replica %s admitted in quorum %d at step %d", self.config.replica_id, quorum.id, self.step)
        if self.config.shard_count > 1 and self._eviction is None:
            self._eviction = EvictionWatch(self.tracker, self.config.shard_rank, lambda: self.stopped, self._drain)

    def close(self, reason: str = "finished", failed: bool = False) -> None:
        """Leave the job (the others go on without this replica) and stop;
        ``failed``: it leaves because the script failed (the coordinator
        then counts it lost, not finished)."""
        if not self.stopped:
            self.stopped = True
            if self._step_hook is not None:
                self._step_hook.remove()
                self._step_hook = None
            if self.membership is not None:
                try:
                    self.membership.leave(reason, failed=failed)
                except FthsdpError as e:
                    log.warning("could not tell the coordinator that this replica leaves: %s", e)
                    self.membership.close()
            if self._server is not None:
                self._server.close()
            self.ftar.groups.release()  # so that the script exits normally, even past a hung peer

    def _guard_step(self, optimizer, args, kwargs) -> None:
        """An optimizer step pre-hook: a step outside the update is one a joiner would not replay."""
        if not self.replayer.in_update and not self.stopped:
            raise step_outside_update()

    def __enter__(self) -> "Manager":
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
        gradients alone, once this replica has been drained out of the quorum.
        A result with ``contributors == 0`` is a step nobody contributed a
        gradient to (a joiner left alone): ``commit()`` does not commit it
        and the loop runs the step again.
        """
        if self.stopped:
            return None
        self._raise_if_evicted()
        if self._reduced:
            raise ApiMisuse("allreduce_gradients() called twice in one step; call commit() to end the step")
        if self.group is None:
            raise ApiMisuse("allreduce_gradients() before start()")
        contributes = True
        if self._following:
            # Caught up, not yet admitted: follow the members until a quorum
            # includes this replica. The gradients just computed are then for
            # a step the state has moved past: this step contributes none.
            self.clock.working(pb.PHASE_STARTING, self.step)
            self._joiner.run(time.monotonic() + self._admission_timeout, until_admitted=True)
            self._following, contributes = False, False
            self._admitted()
        # From here on this replica, a member, waits for the others (not while it followed them as a joiner).
        self.clock.arrive(self.step)
        # The step's inputs, as a joiner will restore them before replaying its update.
        self._inputs = self.state.inputs(self.step)
        self.source.publish_inputs(self._inputs)
        self.gap.taken = None
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # (a DTensor for an FSDP2 parameter)
        grads = [p.grad for p in self._params]
        check_dense(grads)
        shards = [_local(g) for g in grads]

        spare = shards[0].new_zeros(CONTROL_SLOTS)  # FTAR's switch proposals ride along
        running = self.state.running
        grad_numel = sum(g.numel() for g in shards)
        first_only = (grad_numel, grad_numel + running.numel()) if running.carries else None

        def flatten() -> torch.Tensor:  # the gradients stay intact, so a redo can flatten again
            stats = running.pieces(spare.dtype, spare.device) if first_only else []
            flat = torch.cat([g.reshape(-1) for g in shards] + stats + [spare])
            return flat if contributes else flat.zero_()

        proposal, self._proposal = self._proposal, 0
        try:
            result = self.ftar.allreduce(
                self.step, flatten(), self.structure, refill=flatten, contributes=contributes, proposal=proposal,
                control_slots=True, idle=self.gap.while_waiting, serve=self._serve, first_only=first_only,
            )
        except Evicted:
            if self._drain.is_set():  # drained: the quorum went on without us
                self.stopped = True
                return None
            raise
        if not contributes and self.config.shard_count > 1:
            # Every rank of the group must have joined at the same step (the
            # members switch every shard's group at one agreed step boundary).
            top, neg_bottom = self.group.max(result.step, -result.step)
            if top != -neg_bottom:
                raise FtarError(f"the ranks of replica {self.replica_id} joined the quorum at steps {-neg_bottom}..{top}")
        for p, grad in zip(self._params, grads):
            p.grad = grad  # a joiner's replays inside FTAR reset the gradients; the result goes here
        self._reduced = True
        self.last = result
        if result.contributors == 0:  # the members were all lost as this joiner joined
            require_state_held(self.replica_id, self.step, self.ftar.members_step)
            self._sentinel = None
            return result
        self.replayer.apply_sum(result.total, result.contributors)  # as a joiner's replay does
        if self.gap.taken is not None:
            self._inputs = self.gap.taken  # a joiner entered the members' step with their inputs
        if self._inputs.step != result.step:
            raise FtarError(f"internal: the inputs recorded are of step {self._inputs.step}, the sum of step {result.step}")
        self.step = result.step  # a joiner that closed a gap of several steps is further on
        self._sentinel = gradient_sample(self._params[0])
        # A snapshot taken at the last boundary must be copied before the update changes the state.
        with self.clock.section("snapshot copy", None):  # serving a joiner may take long: not a hang
            self.source.wait_copied(self.config.timeout)
        return result

    def commit(self) -> bool:
        """Run the step's update on the averaged gradients, then mark the step
        boundary. Returns False when the step is not committed (no member
        contributed a gradient to it: the loop runs it again)."""
        if self.stopped:
            return False
        if not self._reduced:
            raise ApiMisuse("commit() before allreduce_gradients(): every step must all-reduce its gradients first")
        self._raise_if_evicted()
        self._reduced = False
        last = self.last
        if last.contributors == 0:
            self.optimizer.zero_grad(set_to_none=True)
            log.warning("step %d: no member contributed a gradient (quorum %d); it is run again", self.step, last.quorum_id)
            self.clock.begin(self.step)
            return False
        self.clock.working(pb.PHASE_UPDATE, self.step)
        check_gradient(self._params[0], self._sentinel)
        with self.replayer.updating(last.contributors):
            self._update()
        self.step += 1
        m = self.membership
        m.step = self.step
        m.training_quorum_id = last.quorum_id
        every = self.config.checksum_every
        periodic = bool(every) and self.step % every == 0
        parts = self.replayer.part_checksums(self.group) if periodic or self._checksum_wanted else {}
        checksum = combine_hex(parts) if parts else ""
        if periodic:
            m.state_checksum, m.checksum_step = checksum, self.step
            m.recent_checksums = self._history.record(self.step, checksum)
        self._checksum_wanted = False
        self.log.append(
            self._inputs, last.total, last.contributors, last.quorum_id, checksum,
            json.dumps(parts, separators=(",", ":")) if parts else "",
        )
        latest = m.latest
        drain = self._drain.is_set() or (latest is not None and latest.drain_requested)
        # Every rank of the group must stop, snapshot, or propose a switch to
        # a growth quorum at the same step boundary (the ranks' proposals
        # must be equal, so that every shard's group switches at one step).
        proposal = self.ftar.growth_ready()
        drain, snapshot, top, neg_bottom = self.group.max(int(drain), int(self.source.wanted), proposal, -proposal)
        self._proposal = top if top == -neg_bottom else 0
        if snapshot:
            with self.clock.section("snapshot", None):
                self.source.take(self.step, self.state.capture())
            self._checksum_wanted = True  # the joiner checks its replay against the next step's checksum
        else:
            self.source.expire()  # a joiner that died without releasing its snapshot
        if self._joiner is not None:
            self._joiner.finish()  # the first step in the quorum is committed: release the source
            self._joiner = None
        if drain:
            log.info("replica %s drains after step %d", self.config.replica_id, self.step)
            self.close("drained")
        self.clock.begin(self.step)
        return True

    def _serve(self, request):
        """FTAR's requests of a joiner (agent/last_gap.py): its own work, not a wait for the others."""
        self.clock.working(pb.PHASE_UPDATE, self.step)
        try:
            return self.gap.serve(request)
        finally:
            self.clock.arrive(self.step)

    def _raise_if_evicted(self) -> None:
        """Another rank of this group died and the coordinator took the group
        out: this rank's state is lost with it (agent/eviction.py)."""
        watch = self._eviction
        if watch is not None and watch.evicted and not self._drain.is_set():
            watch.acknowledged.set()
            raise Evicted(f"{watch.evicted}: its state must be caught up again (its agent restarts the group)")

    # ----- catch-up (agent/joiner.py, agent/replay.py, agent/last_gap.py) ------------------

    def load_snapshot(self, state: dict, step: int) -> None:
        self.state.load(state)
        self.step = self.membership.step = step

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        """Apply one logged step, exactly as the members did."""
        self.replayer.replay(entry, total)
        self._moved()

    def _moved(self) -> None:
        """The state's step moved by a replay: heartbeats report it."""
        if self.membership is not None:
            self.membership.step = self.step

    def report_progress(self, done: int, total: int) -> None:
        if self.leader:
            self.membership.catch_up_progress = (done, total)

    @property
    def checksum(self) -> str:
        """The last periodic state checksum reported ("" before the first)."""
        return self.membership.state_checksum if self.membership is not None else ""
