"""The step of a script run outside `fthsdp agent`: one replica, no coordinator.

The same script then debugs as plain PyTorch: the average over one replica
is its own gradient, and the update runs as it would in a job (the replay
contract is still checked, so a loop that breaks it fails here first). A
SIGTERM still ends the loop at the next step boundary.
"""

from __future__ import annotations

import logging

import torch

from fthsdp.agent import outcome
from fthsdp.agent.training.catchup.replay import Replayer
from fthsdp.agent.training.config import ManagerConfig
from fthsdp.agent.training.ftar.allreduce import StepResult
from fthsdp.agent.training.session.lifecycle import Ending, Lifecycle
from fthsdp.agent.training.session.participation import Participation
from fthsdp.agent.training.state.train_state import gradient_sample
from fthsdp.agent.training.step.clock import StepClock
from fthsdp.agent.training.step.script_hooks import ScriptHooks
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.manager")


class StandaloneStep:
    quorum_id = 0
    checksum = ""

    def __init__(self, config: ManagerConfig, replayer: Replayer, lifecycle: Lifecycle, clock: StepClock,
                 hooks: ScriptHooks) -> None:
        self.config = config
        self._replayer = replayer
        self._lifecycle = lifecycle
        self._clock = clock
        self._hooks = hooks
        self._sentinel: torch.Tensor | None = None
        if config.shard_rank == 0:
            log.warning("fthsdp: FTHSDP_REPLICA_ID is not set (not run by `fthsdp agent`): training as one "
                        "standalone replica, with no coordinator and no fault tolerance")
        lifecycle.joined()
        clock.begin(replayer.step)

    def participation(self) -> Participation:
        return Participation(0, 1)

    def reduce(self, contributes: bool) -> StepResult:
        self._sentinel = gradient_sample(self._replayer.params[0])
        return StepResult(torch.empty(0), contributors=1, quorum_id=0, abandoned=0, step=self._replayer.step)

    def apply(self, last: StepResult, replayed: bool) -> None:
        self._clock.working(pb.PHASE_UPDATE, self._replayer.step)
        self._replayer.run_update(last.contributors, self._sentinel, replayed)
        step = self._replayer.step
        if self._lifecycle.drain_requested:
            self.leave(Ending.DRAINED, f"drained after step {step} (asked by {self._lifecycle.drain_asked_by})")
        self._clock.begin(step)

    def raise_if_evicted(self) -> None:
        """Nobody takes a standalone replica out."""

    def leave(self, ending: Ending, detail: str) -> None:
        stop_unconnected(self.config, self._lifecycle, self._hooks, ending, detail)


def stop_unconnected(config: ManagerConfig, lifecycle: Lifecycle, hooks: ScriptHooks, ending: Ending,
                     detail: str) -> None:
    """Stop a replica that has no job to leave (standalone, or closed before ``start()``)."""
    if not lifecycle.stop(ending, detail):
        return
    if ending not in (Ending.FINISHED, Ending.JOB_FINISHED):
        log.info("replica %s stopped (%s): %s", config.replica_id, ending.value, detail)
    hooks.remove()
    outcome.write(config.outcome_file, ending.value, detail)
