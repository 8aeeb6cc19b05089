"""The state a joiner brings to the members' step, as the Joiner sees it.

The Joiner (fthsdp/agent/training/joiner.py) moves this rank's state forward
by a source's snapshot and log; this object is all it can touch: the state,
its replayer, and what the coordinator hears of the progress. It implements
``joiner.CatchingUp``.
"""

from __future__ import annotations

from typing import Any

import torch

from fthsdp.agent.training.membership import Membership
from fthsdp.agent.training.replay import Replayer
from fthsdp.agent.training.replica_group import ReplicaGroup
from fthsdp.agent.training.train_state import TrainState
from fthsdp.protos.v1 import catchup_pb2 as cpb


class CatchUpTarget:
    def __init__(self, state: TrainState, replayer: Replayer, membership: Membership, leader: bool) -> None:
        """``leader``: rank 0 of the replica group, which reports the transfer's progress."""
        self._state = state
        self._replayer = replayer
        self._membership = membership
        self._leader = leader

    @property
    def step(self) -> int:
        return self._replayer.step

    def load_snapshot(self, state: dict[str, Any], step: int) -> None:
        self._state.load(state)
        self._replayer.step = step
        self.moved()

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        self._replayer.replay(entry, total)
        self.moved()

    def verify(self, entry: cpb.LogEntry, group: ReplicaGroup) -> bool:
        return self._replayer.verify(entry, group)

    def report_progress(self, done: int, total: int) -> None:
        if self._leader:
            self._membership.catch_up_progress = (done, total)

    def moved(self) -> None:
        """The state's step moved (a replay, a snapshot): heartbeats report it."""
        self._membership.step = self._replayer.step
