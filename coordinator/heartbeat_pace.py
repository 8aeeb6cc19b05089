"""How often replicas heartbeat, stretched to fit the coordinator's budget.

Every heartbeat costs the coordinator CPU (benchmarks/README.md: about 0.25
ms for a unary call, 0.08 ms on a HeartbeatStream, in Python). At 10,000
replicas and 1 Hz that is more than two cores. Crashes do not need
heartbeats to be noticed (the Watch stream closes at once and the agent
reports the failure); heartbeats catch hangs and carry progress. So above
``budget`` heartbeats per second the interval stretches to
``senders / budget``, and the timeout with it, in proportion: a hung replica
is then noticed later, a crashed one as fast as before.

When the interval shrinks again (replicas left), senders learn the new one
from their next Watch event but may still be waiting out the old interval:
the old, longer timeout holds until one old interval has passed, so that no
replica is timed out for obeying the interval it was given.

Pure: the clock is an argument (tests/test_heartbeat_pace.py).
"""

from __future__ import annotations

import dataclasses


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

    def update(self, senders: int, now: float) -> Pace:
        """The pace for ``senders`` heartbeating processes at time ``now``:
        ``interval`` is what they are told, ``timeout`` what silence means."""
        interval = self.base.interval
        if self.budget > 0:
            interval = max(interval, senders / self.budget)
        timeout = self.base.timeout * interval / self.base.interval
        if interval < self.current.interval:
            # Shrinking: keep the longer timeout one old interval more.
            self._held_timeout, self._hold_until = self.current.timeout, now + self.current.interval
        if now < self._hold_until:
            timeout = max(timeout, self._held_timeout)
        self.current = Pace(interval, timeout)
        return self.current
