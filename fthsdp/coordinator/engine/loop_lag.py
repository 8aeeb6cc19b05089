"""How far behind the coordinator runs: its own lateness, not the replicas'.

Everything the coordinator does runs on one asyncio loop over one gRPC
server: heartbeats, registrations, pushing quorums to thousands of Watch
streams. When a burst (a 10,000-replica job starting, a big admission) or
plain overload keeps it busy, a heartbeat that was sent on time waits in
line before the coordinator records it. Left alone, the coordinator would
then time out replicas for its own delay, and every such removal is another
quorum to push: a vicious circle (measured: at 6,000 simulated replicas on
two shared cores, heartbeats queued inside gRPC for 15 s while the event
loop itself never ran more than 0.7 s late).

Two measures, both added to the heartbeat timeout by the runtime:

- ``LagWindow``: the worst lag of the event loop seen recently (it woke a
  sleeper this much later than asked). Catches a loop that is stalled,
  including one still stalled, or that has just come back and not yet woken
  the prober: the time since the prober last ran counts as lag too. Without
  that, a decision taken first after a stall (whose timer fired before the
  prober's) saw none of it, and counted every live replica lost for the
  coordinator's own silence (a 5.6 s stall of a loaded 2-core machine did).
- ``backlog``: how much later than they should be the heartbeats of the
  *typical* replica are. Every replica sends once per interval, so the
  median time since a replica was last heard of is about half an interval;
  if it is much more, the replicas did not all go quiet at once: their
  heartbeats are queued on the way in (in gRPC, in the kernel, on a
  congested network). A replica that is really silent is still caught: it
  stays silent while the others' ages are normal. (Most members silent at
  once is the split-brain guard's case, see fthsdp/coordinator/decisions/quorum.py.)

Both are exported as gauges, the first thing to look at when the
coordinator is overloaded. Pure: times are arguments (tests/test_loop_lag.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

PROBE_INTERVAL = 0.05
"""Seconds between probes: the smallest lag worth noticing is about this."""


class LagWindow:
    """The largest lag observed within the last ``window`` seconds.

    With ``every`` (the prober's period), a prober that has not recorded for
    longer than that is itself late: ``worst`` counts the overdue time from
    its first record on (before, nothing probes; tests driving a fake clock
    without a prober are unaffected)."""

    def __init__(self, window: float, every: float | None = None) -> None:
        if window <= 0:
            raise ValueError(f"the lag window must be positive, not {window}")
        self.window = window
        self.every = every
        self._samples: deque[tuple[float, float]] = deque()  # (time, lag), lags decreasing
        self._last: float | None = None  # when the prober last recorded

    def record(self, now: float, lag: float) -> None:
        # A monotonic deque: an older sample no larger than the new one can
        # never be the maximum again, so the maximum is always at the left.
        while self._samples and self._samples[-1][1] <= lag:
            self._samples.pop()
        self._samples.append((now, max(0.0, lag)))
        self._last = now
        self._expire(now)

    def worst(self, now: float) -> float:
        self._expire(now)
        seen = self._samples[0][1] if self._samples else 0.0
        return max(seen, self.overdue(now))

    def overdue(self, now: float) -> float:
        """How much later than expected the prober is now: a stall still
        going on, or just over and not yet recorded."""
        if self.every is None or self._last is None:
            return 0.0
        return max(0.0, now - self._last - self.every)

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


BACKLOG_MIN_REPLICAS = 16
"""Below this many replicas the typical one says too little: one silent
replica of two would be "typical". Small jobs do not overload a coordinator."""


def backlog(ages: list[float], interval: float) -> float:
    """How late the typical replica's heartbeats arrive: the (lower) median
    of ``ages`` (seconds since each live replica was last heard of) beyond
    one ``interval``; 0 when that is normal or there are too few replicas."""
    if len(ages) < BACKLOG_MIN_REPLICAS:
        return 0.0
    median = sorted(ages)[(len(ages) - 1) // 2]
    return max(0.0, median - interval)
