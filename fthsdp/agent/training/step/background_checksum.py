"""The periodic state checksum, computed off the training thread.

Every ``checksum_every`` steps a replica reports a CRC-32 of its committed
state (fthsdp/agent/training/state/checksum.py), which the coordinator
compares across replicas. On the training thread it costs a pass over the
state at about 3.6 GB/s: for the 300 MB AdamW state of
benchmarks/step_time.py's comm-heavy model, 9 ms a step at one checksum every
10 steps, 3% of the step (benchmarks/step_profile.py).

The state does not change between a step boundary and the next update: the
forward and backward passes read the parameters, and only the update writes
them and the optimizer's state. So a thread of its own computes the CRC
while the next step's forward pass, backward pass and all-reduce run (zlib
releases the GIL), and the training thread *settles* it before the next
update: waits for it (by then, normally done), reports it, and writes it
into the gradient log's entry (a joiner checks its replay by it). What may
change before the update is read at the boundary: the buffers (a forward
pass updates batch-norm statistics), the registered objects and the
hyperparameters (``TrainState.part_checksums_later``).

A checkpoint's checksum too: the share's writer waits for it before it
writes the share's record, so a checkpoint step stalls the training thread
for the staging copy alone.

In the background only where the replica group has one rank. With several,
the group's checksum is an all-gather of the ranks' parts, a collective that
every rank must run at the same point, and each rank's pass covers only its
shard. A checksum a joiner checks its replay by is needed at the boundary
itself. Those are computed there, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.catchup.replay import combine_hex
from fthsdp.agent.training.state.checksum import StridedHistory


class _Job:
    """One checksum on a thread of its own; ``parts()`` waits for it (and raises what it raised)."""

    def __init__(self, compute: Callable[[], dict[str, int]]) -> None:
        self._compute = compute
        self._parts: dict[str, int] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fthsdp-checksum", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._parts = self._compute()
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, which raises it
            self._error = e

    def parts(self) -> dict[str, str]:
        """(Any thread; every call returns the same.)"""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._parts is not None
        return {k: f"{v:08x}" for k, v in self._parts.items()}


class PeriodicChecksums:
    """The training thread's periodic checksums: started at a boundary, settled before the next update."""

    def __init__(self, every: int, publish: Callable[..., None], log: GradientLog) -> None:
        """``publish``: the replica's report (``Reporting.publish``)."""
        self.history = StridedHistory(every)
        self._publish = publish
        self._log = log
        self._pending: tuple[int, int, str, bool, _Job] | None = None
        """(state step, log entry step, the inputs' hyperparameters, whether it is reported, the job)."""

    def report(self, step: int, hyperparams: str, parts: dict[str, str]) -> str:
        """A checksum of ``step`` computed at the boundary: reported now; returns it."""
        checksum = combine_hex(parts)
        self._publish(state_checksum=checksum, checksum_step=step,
                      recent_checksums=self.history.record(step, checksum, hyperparams))
        return checksum

    def start(self, step: int, entry_step: int, hyperparams: str, compute: Callable[[], dict[str, int]],
              report: bool = True) -> Callable[[], str]:
        """Compute the checksum of ``step`` in the background (the log's entry
        ``entry_step`` gets it when settled; reported then unless ``report``
        is False: a checkpoint's at a step that is not periodic). Returns how
        another thread waits for it (a checkpoint's writer)."""
        self.settle()
        job = _Job(compute)
        self._pending = (step, entry_step, hyperparams, report, job)
        return lambda: combine_hex(job.parts())

    def settle(self) -> None:
        """Before anything changes the state (or reads the checksum): wait for
        the checksum in flight, if any, report it and log it."""
        if self._pending is None:
            return
        (step, entry_step, hyperparams, report, job), self._pending = self._pending, None
        parts = job.parts()
        checksum = self.report(step, hyperparams, parts) if report else combine_hex(parts)
        self._log.set_checksum_after(entry_step, checksum, parts)
