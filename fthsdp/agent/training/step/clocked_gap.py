"""A joiner's answers to FTAR, timed as its own work on the step clock.

While FTAR waits in a collective this replica is *waiting* for the others
(the coordinator's hang verdicts read the step clock: fthsdp/agent/training/step/clock.py);
when FTAR asks the joiner to replay or to read the members' inputs
(fthsdp/agent/training/catchup/last_gap.py), that is this replica's own work,
and a slow replay must count as its update, not as a wait for the others.
"""

from __future__ import annotations

from fthsdp.agent.training.catchup.last_gap import LastGap
from fthsdp.agent.training.catchup.replay import Replayer
from fthsdp.agent.training.step.clock import StepClock
from fthsdp.protos.v1 import coordinator_pb2 as pb


class ClockedGap:
    """A ``Joining`` (fthsdp/agent/training/ftar/results.py): the last gap, each answer timed as work."""

    def __init__(self, gap: LastGap, clock: StepClock, replayer: Replayer) -> None:
        self._gap, self._clock, self._replayer = gap, clock, replayer

    def close_gap(self, step: int, head: int) -> int:
        self._clock.working(pb.PHASE_UPDATE, self._replayer.step)
        try:
            return self._gap.close_gap(step, head)
        finally:
            self._clock.arrive(self._replayer.step)

    def enter_step(self, head: int) -> None:
        self._clock.working(pb.PHASE_UPDATE, self._replayer.step)
        try:
            self._gap.enter_step(head)
        finally:
            self._clock.arrive(self._replayer.step)

    def replay_to(self, head: int) -> int:
        self._clock.working(pb.PHASE_UPDATE, self._replayer.step)
        try:
            return self._gap.replay_to(head)
        finally:
            self._clock.arrive(self._replayer.step)

    def while_waiting(self) -> None:
        """Between polls of a wait: the replay of one step is short, and the wait goes on."""
        self._gap.while_waiting()
