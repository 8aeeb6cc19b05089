"""How far behind the coordinator's event loop runs.

Everything the coordinator does runs on one asyncio loop: heartbeats,
registrations, pushing quorums to thousands of Watch streams. When a burst
(a 10,000-replica job starting, a big admission) keeps the loop busy, a
heartbeat that arrived on time waits in line before the coordinator records
it. Left alone, the coordinator would then time out replicas for its own
delay, and every such removal is another quorum to push: a vicious circle.

``LagWindow`` keeps the worst lag seen recently (the loop woke a sleeper
this much later than asked); the runtime adds it to the heartbeat timeout,
so a replica is only timed out for silence that is its own. It is also
exported as a gauge, the first thing to look at when the coordinator is
overloaded. Pure: times are arguments (tests/test_loop_lag.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

PROBE_INTERVAL = 0.05
"""Seconds between probes: the smallest lag worth noticing is about this."""


class LagWindow:
    """The largest lag observed within the last ``window`` seconds."""

    def __init__(self, window: float) -> None:
        if window <= 0:
            raise ValueError(f"the lag window must be positive, not {window}")
        self.window = window
        self._samples: deque[tuple[float, float]] = deque()  # (time, lag), lags decreasing

    def record(self, now: float, lag: float) -> None:
        # A monotonic deque: an older sample no larger than the new one can
        # never be the maximum again, so the maximum is always at the left.
        while self._samples and self._samples[-1][1] <= lag:
            self._samples.pop()
        self._samples.append((now, max(0.0, lag)))
        self._expire(now)

    def worst(self, now: float) -> float:
        self._expire(now)
        return self._samples[0][1] if self._samples else 0.0

    def _expire(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window:
            self._samples.popleft()


async def probe(window: LagWindow, clock: Callable[[], float] = time.monotonic) -> None:
    """Sleep ``PROBE_INTERVAL`` again and again; record how late each wake is."""
    while True:
        asked = clock() + PROBE_INTERVAL
        await asyncio.sleep(PROBE_INTERVAL)
        now = clock()
        window.record(now, now - asked)


LAG_STEP = 0.25
"""Seconds: the allowance moves in steps of this, so that jitter does not
change the timeout (and so force a new decision) on every tick."""


def lag_allowance(worst: float) -> float:
    """What to add to the heartbeat timeout for a loop that ran ``worst`` late:
    nothing for jitter below one step, else ``worst`` rounded up to a step."""
    if worst < LAG_STEP:
        return 0.0
    return -(-worst // LAG_STEP) * LAG_STEP
