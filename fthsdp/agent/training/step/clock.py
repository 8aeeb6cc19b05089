"""Where this process is in its step, for the coordinator's hang and
straggler verdicts (fthsdp/coordinator/decisions/hang.py).

The training thread owns a ``StepClock``: the Manager tells it when a step
begins, reaches the all-reduce and its update, and the script marks the
sections that may legitimately take long (``Manager.section``). The
heartbeat thread only reads ``progress()``, built from one immutable tuple
that the training thread replaces whole, so it needs no lock.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator

from fthsdp.protos.v1 import coordinator_pb2 as pb

WINDOW = 16
"""Steps in the medians of step and compute time."""


class StepClock:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._now: tuple[pb.Phase, float, int, str, float] = (pb.PHASE_STARTING, clock(), 0, "", 0.0)
        """(phase, since, step, section, section timeout): replaced whole, never changed."""
        self._medians = (0.0, 0.0)
        self._step_times: deque[float] = deque(maxlen=WINDOW)
        self._compute_times: deque[float] = deque(maxlen=WINDOW)
        self._boundary: float | None = None
        self._in_sections = 0.0
        """Seconds of the current step's compute spent in marked sections (not compute)."""

    # ----- the training thread -------------------------------------------------------

    def begin(self, step: int) -> None:
        """A step begins (after start(), or a commit): the compute phase."""
        now = self._clock()
        if self._boundary is not None:
            self._step_times.append(now - self._boundary)
            self._medians = (statistics.median(self._step_times), self._medians[1])
        self._boundary, self._in_sections = now, 0.0
        self._now = (pb.PHASE_COMPUTE, now, step, "", 0.0)

    def arrive(self, step: int) -> None:
        """The all-reduce begins: from here on this process waits for the others."""
        now = self._clock()
        if self._boundary is not None and self._now[0] == pb.PHASE_COMPUTE:
            self._compute_times.append(max(0.0, now - self._boundary - self._in_sections))
            self._medians = (self._medians[0], statistics.median(self._compute_times))
        self._now = (pb.PHASE_ALLREDUCE, now, step, "", 0.0)

    def working(self, phase: pb.Phase, step: int) -> None:
        """Doing its own work (its update, or a joiner's replay inside the all-reduce)."""
        self._now = (phase, self._clock(), step, "", 0.0)

    @contextlib.contextmanager
    def section(self, name: str, timeout: float | None) -> Iterator[None]:
        before, began = self._now, self._clock()
        self._now = (pb.PHASE_SECTION, began, before[2], name, float(timeout or 0.0))
        try:
            yield
        finally:
            now = self._clock()
            self._in_sections += now - began
            self._now = (before[0], now, before[2], before[3], before[4])

    # ----- the heartbeat thread ------------------------------------------------------

    def progress(self) -> pb.Progress:
        phase, since, step, section, timeout = self._now
        step_time, compute_time = self._medians
        return pb.Progress(
            phase=phase, phase_age_s=max(0.0, self._clock() - since), step=step, step_time_s=step_time,
            compute_time_s=compute_time, section=section, section_timeout_s=timeout,
        )
