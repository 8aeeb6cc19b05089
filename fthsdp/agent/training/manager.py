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

The Manager is a facade: it checks that the script calls it in order and
hands each call to the step it runs, ``ReplicaStep`` under `fthsdp agent`
(fthsdp/agent/training/step/replica_step.py) or ``StandaloneStep`` outside it
(fthsdp/agent/training/step/standalone.py). The replica step registers the replica with the coordinator, learns every
membership change from its push (no coordinator call on a step where nothing
changed) and hosts the rendezvous store of the quorums it is the first member
of. A SIGTERM, or ``fthsdp drain``, makes the replica leave at the next step
boundary; ``stopped`` then turns true and the script should exit 0. Data
sharding by ``(step, replica_rank)`` or by ``participation()``:
fthsdp/agent/training/session/participation.py. A replica that starts behind the quorum catches up
from a peer inside ``start()`` (fthsdp/agent/training/catchup/joiner.py) and replays the steps it
missed through the same ``update`` (fthsdp/agent/training/catchup/replay.py; the contract that makes
that bit-identical: fthsdp/agent/training/state/train_state.py). Where each process is in its step
goes to the coordinator, which takes out a replica that others wait for past
the hang limit (fthsdp/agent/training/step/clock.py, fthsdp/coordinator/decisions/hang.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Protocol

import torch
import torch.distributed as dist
from torch.profiler import record_function

from fthsdp.agent.standby import wait_for_activation
from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.catchup.replay import Replayer
from fthsdp.agent.training.catchup.report import CatchUpReport
from fthsdp.agent.training.config import ManagerConfig
from fthsdp.agent.training.ftar.allreduce import StepResult
from fthsdp.agent.training.ftar.buffer_pool import BufferPool
from fthsdp.agent.training.session.lifecycle import Ending, Lifecycle
from fthsdp.agent.training.session.participation import Participation
from fthsdp.agent.training.state.checksum import structure_hash
from fthsdp.agent.training.state.train_state import TrainState, default_update
from fthsdp.agent.training.step.clock import StepClock
from fthsdp.agent.training.step.replica_step import ReplicaStep
from fthsdp.agent.training.step.script_hooks import ScriptHooks
from fthsdp.agent.training.step.standalone import StandaloneStep, stop_unconnected
from fthsdp.core.errors import ApiMisuse, ConfigError, FtarError, StateNotHeld

__all__ = ["ApiMisuse", "Manager", "ManagerConfig", "Participation", "StateNotHeld"]


class _Step(Protocol):
    """What the Manager runs a step through: ``ReplicaStep`` or ``StandaloneStep``."""

    @property
    def quorum_id(self) -> int: ...

    @property
    def checksum(self) -> str: ...

    def participation(self) -> Participation: ...

    def reduce(self, contributes: bool) -> StepResult | None: ...

    def apply(self, last: StepResult, replayed: bool) -> None: ...

    def raise_if_evicted(self) -> None: ...

    def leave(self, ending: Ending, detail: str) -> None: ...


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
        ``state_dict()``/``load_state_dict()``). See fthsdp/agent/training/state/train_state.py."""
        self.model = model
        self.optimizer = optimizer
        self.config = config
        update = update if update is not None else default_update(optimizer)
        if not callable(update):
            raise ConfigError(f"update must be a function of no arguments, got a {type(update).__name__}")
        self._state = TrainState(model, optimizer, state)
        params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        self._buffers = BufferPool(config.catch_up_log_steps + 3)
        """The steps' flat host buffers, lent to each step and handed back by the log."""
        self._log = GradientLog(config.catch_up_log_steps, config.catch_up_log_bytes, on_drop=self._buffers.give_back)
        """The steps this rank committed, with their sums: what a joiner replays."""
        self._replayer = Replayer(self._state, params, update, self._log)
        """The one place the state moves: the update, live or replayed, and the step it is at."""
        self._lifecycle = Lifecycle()
        """Starting, training or stopped, and how it stopped (fthsdp/agent/training/session/lifecycle.py)."""
        self._clock = StepClock()
        """Where this process is in its step, for the coordinator's hang verdicts
        (fthsdp/agent/training/step/clock.py)."""
        self._hooks = ScriptHooks(optimizer, self._replayer, self._lifecycle)
        self._step: _Step | None = None
        """How this replica runs its steps: set by ``start()``."""
        self._last: StepResult | None = None
        """The all-reduce of the step in progress: set by ``allreduce_gradients()``, applied by ``commit()``."""
        self.catch_up: CatchUpReport | None = None
        """How this replica caught up in ``start()``; None if it started up to date."""

    @classmethod
    def from_env(
        cls, model, optimizer, env: Mapping[str, str] | None = None, *, update=None, state=None, **overrides
    ) -> Manager:
        """The manager configured by `fthsdp agent`. In a warm standby (``fthsdp
        agent --standby``) this waits until the agent activates it.

        The training process's entry point: the one place the training library
        takes settings from ``os.environ`` (``env``, when given, instead);
        everything past it gets them from the ``ManagerConfig`` built here.
        (The one variable it sets, for NCCL's sake: ``choose()`` in
        fthsdp/agent/training/transport/__init__.py.)"""
        env = os.environ if env is None else env
        wait_for_activation(env)
        return cls(model, optimizer, ManagerConfig.from_env(env, **overrides), update=update, state=state)

    # ----- what the loop reads ---------------------------------------------------------

    @property
    def step(self) -> int:
        """The step this replica's state is at: the next step to train. ``start()``
        returns at the step this replica trains next as a member (a joiner has
        taken its first step in the quorum by then); from there every committed
        iteration advances it by exactly one, so a loop that counts its own
        iterations stays in step with it."""
        return self._replayer.step

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
        return self._step.quorum_id if self._step is not None else 0

    @property
    def checksum(self) -> str:
        """The state checksum of the newest periodic step (every ``checksum_every``; "" before the first).
        It is computed off the training thread while the next step runs
        (fthsdp/agent/training/step/background_checksum.py): reading it
        right after that step's ``commit()`` waits for it, so a loop that
        reads it only when it logs keeps the cost off its step."""
        return self._step.checksum if self._step is not None else ""

    def participation(self) -> Participation:
        """This replica's ``index`` among the ``count`` replicas whose gradients
        the next ``allreduce_gradients()`` is expected to average, the same on
        every member (fthsdp/agent/training/session/participation.py). A failure during the step may
        leave fewer (``StepResult.contributors``); a joiner's first step has none of its."""
        if self._step is None:
            raise ApiMisuse("participation() before start(): the replica is in no quorum yet")
        return self._step.participation()

    def section(self, name: str, timeout: float | None = None):
        """``with ft.section("eval"):`` marks work that may take long (evaluation, a checkpoint): the
        coordinator then allows ``timeout`` seconds (default: its --section-timeout), not the hang limit."""
        return self._clock.section(name, timeout)

    # ----- lifecycle -------------------------------------------------------------------

    def start(self, wait_for_replicas: int = 1, admission_timeout: float = 120.0) -> None:
        """Register, and return once this replica is a member of the quorum, at
        the step it trains next: for a fresh job, once a quorum of
        ``wait_for_replicas`` members includes it (a fresh job passes its
        replica count so that every replica starts at step 0 together; a job
        that lost a member before (it starts over after an operator gave up
        its lost state, or goes on from a restored checkpoint) trains with the
        replicas there are, without waiting for more); for a
        replica behind the quorum (also one that starts after the members got
        the count they wait for and began training, whatever its step),
        once it caught up from a peer, was admitted,
        and took its first step in the quorum (without a gradient of its own:
        the members never wait for this replica's forward pass). A drain asked
        for meanwhile, or a job that finished before this replica came, returns
        with ``stopped`` true."""
        cfg = self.config
        if self._step is not None or self.stopped:
            raise ApiMisuse("start() called twice")
        if cfg.shard_count > 1 and not dist.is_initialized():
            raise ConfigError(
                f"this replica group has {cfg.shard_count} ranks: call torch.distributed.init_process_group() "
                "(the group's own world, for FSDP) before Manager.start()"
            )
        self._hooks.install()  # SIGTERM drains, until the replica stops
        if cfg.standalone:
            self._step = StandaloneStep(cfg, self._replayer, self._lifecycle, self._clock, self._hooks)
            return
        try:
            step = ReplicaStep(cfg, self._state, self._replayer, self._log, structure_hash(self.model),
                               self._lifecycle, self._clock, self._hooks, max(cfg.timeout, admission_timeout),
                               self._buffers)
        except BaseException:
            self._hooks.remove()  # the script gets its process back as it was
            raise
        self._step = step
        self.catch_up = step.join(wait_for_replicas, admission_timeout)

    def close(self, reason: str = "finished", failed: bool = False) -> None:
        """Leave the job (the others go on without this replica) and stop;
        ``failed``: it leaves because the script failed (the coordinator
        then counts it lost, not finished)."""
        ending = Ending.FAILED if failed else Ending.DRAINED if reason == "drained" else Ending.FINISHED
        if self._step is not None:
            self._step.leave(ending, reason)
        else:
            stop_unconnected(self.config, self._lifecycle, self._hooks, ending, reason)

    def __enter__(self) -> Manager:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close("finished")
        else:
            self.close(f"failed: {exc[1]}", failed=True)

    # ----- the step --------------------------------------------------------------------

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
        if self._step is None:
            raise ApiMisuse("allreduce_gradients() before start()")
        self._step.raise_if_evicted()
        if self._last is not None:
            raise ApiMisuse("allreduce_gradients() called twice in one step; call commit() to end the step")
        step = self.step
        with record_function("fthsdp.allreduce_gradients"):
            result = self._step.reduce(contributes=True)
        if result is None:
            return None
        if result.step != step:
            raise FtarError(f"internal: replica {self.replica_id} trained step {step} but the quorum summed step "
                            f"{result.step}")
        self._last = result
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
        if self._last is None or self._step is None:
            raise ApiMisuse("commit() before allreduce_gradients(): every step must all-reduce its gradients first")
        self._step.raise_if_evicted()
        last, self._last = self._last, None
        with record_function("fthsdp.commit"):
            self._step.apply(last, replayed=False)
        return True
