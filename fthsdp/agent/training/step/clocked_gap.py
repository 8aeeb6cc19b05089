"""A joiner's answers to FTAR, timed as its own work on the step clock.

While FTAR waits in a collective this replica is *waiting* for the others
(the coordinator's hang verdicts read the step clock: fthsdp/agent/training/step/clock.py);
when FTAR asks the joiner to replay or to read the members' inputs
(fthsdp/agent/training/catchup/last_gap.py), that is this replica's own work,
and a slow replay must count as its update, not as a wait for the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fthsdp.agent.training.catchup.last_gap import LastGap
from fthsdp.agent.training.catchup.replay import Replayer
from fthsdp.agent.training.step.clock import StepClock
from fthsdp.protos.v1 import coordinator_pb2 as pb


class ClockedGap:
    """A ``Joining`` (fthsdp/agent/training/ftar/results.py): the last gap, each answer timed as work."""

    def __init__(self, gap: LastGap, clock: StepClock, replayer: Replayer) -> None:
        self._gap, self._clock, self._replayer = gap, clock, replayer

    @contextlib.contextmanager
    def _working(self) -> Iterator[None]:
        """The answer is this replica's update; once given, it waits for the others again."""
        self._clock.working(pb.PHASE_UPDATE, self._replayer.step)
        try:
            yield
        finally:
            self._clock.arrive(self._replayer.step)

    def close_gap(self, step: int, head: int) -> int:
        with self._working():
            return self._gap.close_gap(step, head)

    def enter_step(self, head: int) -> None:
        with self._working():
            self._gap.enter_step(head)

    def replay_to(self, head: int) -> int:
        with self._working():
            return self._gap.replay_to(head)

    def while_waiting(self) -> None:
        """Between polls of a wait: the replay of one step is short, and the wait goes on."""
        self._gap.while_waiting()
