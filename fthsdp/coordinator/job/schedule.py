"""When a job's quorum is decided next: one time.

A decision costs tens of milliseconds at 10,000 replicas, so the decision
loop takes one only when it could change something. What the replicas'
calls and the checks change says how soon:

* ``now()``: something the decision reads changed in a way that may change
  the quorum (a member lost, a replica ready or gone, a restart, a member
  taken out): decide on the next turn of the loop;
* ``soon()``: something outside the quorum moved (a joiner registered or
  heartbeated, the pace changed): decide, but not before the poll time;
* after a decision, ``decided(settled)``: nothing pending if the quorum is
  settled, else decide again at the poll time; the loop then sets the poll
  time from what the decision cost (``poll_after``), so that polling takes
  a bounded share of its time.

A heartbeat timeout running out is time alone: ``JobState.needs_decision``
finds it (fthsdp/coordinator/job/state.py) and calls ``now()`` or
``soon()``. One owner: the coordinator's event loop.
"""

from __future__ import annotations

import dataclasses

NEVER = float("inf")
AT_ONCE = float("-inf")


@dataclasses.dataclass
class DecisionSchedule:
    at: float = AT_ONCE
    """Decide once the clock reaches this (AT_ONCE: on the next turn; NEVER: nothing pending)."""
    poll_from: float = AT_ONCE
    """The poll time: a decision that is not urgent waits until then."""

    def now(self) -> None:
        self.at = AT_ONCE

    def soon(self) -> None:
        self.at = min(self.at, self.poll_from)

    def decided(self, settled: bool) -> None:
        self.at = NEVER if settled else self.poll_from

    def poll_after(self, t: float) -> None:
        """The poll time is ``t``: a pending poll waits until then (an urgent decision does not)."""
        self.poll_from = t
        if self.at not in (AT_ONCE, NEVER):
            self.at = max(self.at, t)

    def due(self, now: float) -> bool:
        return now >= self.at
