"""How often replicas heartbeat, stretched to fit the coordinator's budget.

Every heartbeat costs the coordinator CPU (benchmarks/README.md: about 0.25
ms for a unary call, 0.08 ms on a HeartbeatStream, in Python). At 10,000
replicas and 1 Hz that is more than two cores. Crashes do not need
heartbeats to be noticed (the Watch stream closes at once and the agent
reports the failure); heartbeats catch hangs and carry progress. So above
``budget`` heartbeats per second the interval stretches to
``senders / budget``, and the timeout with it, in proportion: a hung replica
is then noticed later, a crashed one as fast as before.

The interval moves in steps (multiples of a quarter of the configured
one), and steps down only once the senders fit the lower step with
room to spare: every change is pushed to every replica, and at 10,000
replicas arriving one by one an exact ``senders / budget`` changed with
each of them (gigabytes of pushes in the scale benchmark).

When the interval shrinks again (replicas left), senders learn the new one
from their next Watch event but may still be waiting out the old interval:
the old, longer timeout holds until one old interval has passed, so that no
replica is timed out for obeying the interval it was given.

Pure: the clock is an argument (tests/test_heartbeat_pace.py).
"""

from __future__ import annotations

import dataclasses
import math

STEP = 0.25
"""Stretched intervals are whole multiples of this share of the configured one."""
SLACK = 0.9
"""A lower step is taken once the senders need at most this share of it."""


@dataclasses.dataclass(frozen=True)
class Pace:
    interval: float
    timeout: float


class HeartbeatPacer:
    def __init__(self, interval: float, timeout: float, budget: float) -> None:
        """``interval`` and ``timeout`` as configured; ``budget`` heartbeats per
        second at most (0: no limit)."""
        self.base = Pace(interval, timeout)
        self.budget = budget
        self.current = self.base
        self._held_timeout = timeout
        self._hold_until = 0.0

    def _step(self, wanted: float) -> float:
        """The smallest step at least ``wanted`` seconds long."""
        unit = STEP * self.base.interval
        return max(self.base.interval, unit * math.ceil(round(wanted / unit, 9)))

    def update(self, senders: int, now: float) -> Pace:
        """The pace for ``senders`` heartbeating processes at time ``now``:
        ``interval`` is what they are told, ``timeout`` what silence means."""
        interval = self.base.interval
        if self.budget > 0 and senders > self.budget * interval:
            wanted = senders / self.budget
            interval = self._step(wanted)
            if interval < self.current.interval:  # down only with room to spare
                interval = min(self.current.interval, self._step(wanted / SLACK))
        timeout = self.base.timeout * interval / self.base.interval
        if interval < self.current.interval:
            # Shrinking: keep the longer timeout one old interval more.
            self._held_timeout, self._hold_until = self.current.timeout, now + self.current.interval
        if now < self._hold_until:
            timeout = max(timeout, self._held_timeout)
        self.current = Pace(interval, timeout)
        return self.current
