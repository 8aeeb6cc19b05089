"""A replica's lifecycle in its job: one explicit state, moved by the training thread alone.

::

    STARTING ──(admitted; a joiner's first step taken)──> TRAINING ──(close)──> STOPPED (finished | failed)
      │                                                      │
      │                                                      ├──(drain asked, then the next step boundary,
      │                                                      │   or the quorum went on without it)──> STOPPED (drained)
      │                                                      └──(taken out, no drain asked)──> STOPPED (evicted)
      ├──(drain asked while catching up or waiting for admission)──> STOPPED (drained)
      └──(the job's members all finished before it came)──> STOPPED (job finished)

A drain can be asked for from other threads: SIGTERM (which is how `fthsdp
agent` drains its ranks), and the coordinator's push after `fthsdp drain`, the
admin endpoint ``POST /api/replicas/ID/drain``, or a drain in the replica
record. Asking only sets a flag (``request_drain``); the training thread reads
it at the points where the replica can leave cleanly, and ``ending_for_eviction``
decides, from the flag alone, what an eviction means: the coordinator drops a
draining member from the quorum at once (the others should not wait for it),
so the replica learns it is out before its step boundary, and that is its drain,
not a failure.
"""

from __future__ import annotations

import enum
import threading


class LifeStage(str, enum.Enum):
    STARTING = "starting"
    """In ``start()``: registering, catching up, waiting for admission, a joiner's first step."""
    TRAINING = "training"
    """A member of the quorum: every committed iteration advances ``step`` by one."""
    STOPPED = "stopped"
    """Left the job (``ending`` says how); the API calls return at once."""


class Ending(str, enum.Enum):
    FINISHED = "finished"
    """The script closed the manager: it is done."""
    FAILED = "failed"
    """The script ended by an exception (``close(failed=True)``, or the context manager)."""
    DRAINED = "drained"
    """Asked to leave (SIGTERM, `fthsdp drain`, the admin endpoint): the others train on."""
    EVICTED = "evicted"
    """Taken out of the quorum without a drain asked: its state must be caught up again."""
    JOB_FINISHED = "job finished"
    """It arrived after every member of the job had finished: nothing left to train."""

    @property
    def success(self) -> bool:
        """Whether the process should exit 0 (its agent then does not restart it)."""
        return self in (Ending.FINISHED, Ending.DRAINED, Ending.JOB_FINISHED)


TRANSITIONS: dict[LifeStage, frozenset[LifeStage]] = {
    LifeStage.STARTING: frozenset({LifeStage.TRAINING, LifeStage.STOPPED}),
    LifeStage.TRAINING: frozenset({LifeStage.STOPPED}),
    LifeStage.STOPPED: frozenset(),
}


def ending_for_eviction(drain_requested: bool) -> Ending:
    """What being dropped from the quorum means for a replica: its drain
    when one was asked for (by anyone), otherwise an eviction."""
    return Ending.DRAINED if drain_requested else Ending.EVICTED


class Lifecycle:
    """The state of one replica's process; ``Manager`` owns it."""

    def __init__(self) -> None:
        self.stage = LifeStage.STARTING
        self.ending: Ending | None = None
        self.detail = ""
        """Why it stopped, in words (for the log and the agent)."""
        self._drain = threading.Event()
        self.drain_asked_by = ""

    # ----- from any thread -------------------------------------------------------

    def request_drain(self, by: str) -> None:
        """Ask the replica to leave at its next clean point (thread-safe, idempotent)."""
        if not self._drain.is_set():
            self.drain_asked_by = by
            self._drain.set()

    @property
    def drain_requested(self) -> bool:
        return self._drain.is_set()

    @property
    def drain_event(self) -> threading.Event:
        """The flag itself, for watchers that must not treat a drain as an eviction
        (fthsdp/agent/training/step/eviction.py)."""
        return self._drain

    # ----- the training thread ---------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self.stage is LifeStage.STOPPED

    def joined(self) -> None:
        self._move(LifeStage.TRAINING)

    def stop(self, ending: Ending, detail: str = "") -> bool:
        """Move to STOPPED; False if it already was (the first ending stands)."""
        if self.stopped:
            return False
        self._move(LifeStage.STOPPED)
        self.ending, self.detail = ending, detail or ending.value
        return True

    def _move(self, stage: LifeStage) -> None:
        if stage not in TRANSITIONS[self.stage]:
            raise RuntimeError(f"bug: replica lifecycle {self.stage.value} -> {stage.value} is not allowed")
        self.stage = stage
