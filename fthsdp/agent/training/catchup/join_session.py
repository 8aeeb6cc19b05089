"""Every way a replica's join into the quorum can end, in one place.

``ReplicaStep.join`` (fthsdp/agent/training/step/replica_step.py) runs the
joiner (fthsdp/agent/training/catchup/joiner.py) and gets one ``Joined``:

* ``UP_TO_DATE``: admitted without catching up (its state was the members'):
  it trains at once;
* ``CAUGHT_UP``: it copied the state from a source, replayed and was
  admitted; its first step in the quorum follows, without a gradient, and
  closes the last step or two from the same source (a ``JoinSession`` holds
  it until that step is committed);
* ``DRAINED``: a drain was asked for while it caught up or waited for
  admission: it leaves, and the script exits 0;
* ``JOB_FINISHED``: every member finished before it came: nothing to train.

A source lost is not an end: before the admission the joiner starts over
from the next source the coordinator names (``Joiner.run``); after it, inside
the first step, the last gap switches to the next source
(fthsdp/agent/training/catchup/last_gap.py), and a joiner left with none raises
``StateNotHeld``. Taken out of the quorum during its first step, it raises
``Evicted`` (the step's all-reduce); any other failure raises too: the
process ends, and its agent restarts it.
"""

from __future__ import annotations

import dataclasses
import enum

from fthsdp.agent.training.catchup.joiner import Drained, Joiner
from fthsdp.agent.training.catchup.last_gap import LastGap
from fthsdp.agent.training.catchup.report import CatchUpReport
from fthsdp.agent.training.session.job_finished import JobFinished


class JoinEnd(str, enum.Enum):
    UP_TO_DATE = "up to date"
    CAUGHT_UP = "caught up"
    DRAINED = "drained"
    JOB_FINISHED = "job finished"


@dataclasses.dataclass(frozen=True)
class Joined:
    end: JoinEnd
    detail: str = ""
    """DRAINED, JOB_FINISHED: the one line that says why ("job default finished at step 500")."""
    report: CatchUpReport | None = None
    """How it caught up (None: it did not)."""


def join_quorum(joiner: Joiner, timeout: float, min_members: int) -> Joined:
    """Run ``joiner`` until this replica is admitted into a quorum of at least
    ``min_members`` (or leaves); ``timeout``: seconds to wait each time for a
    source to be named or for the admission."""
    try:
        joiner.run(timeout, min_members=min_members, until_admitted=True)
    except Drained as e:
        joiner.finish()
        return Joined(JoinEnd.DRAINED, str(e), joiner.report)
    except JobFinished as e:  # nothing left to train: the script's loop ends and it exits 0
        joiner.finish()
        return Joined(JoinEnd.JOB_FINISHED, str(e), joiner.report)
    return Joined(JoinEnd.CAUGHT_UP if joiner.source_address else JoinEnd.UP_TO_DATE, report=joiner.report)


class JoinSession:
    """A caught-up joiner until its first step in the quorum is committed: the
    source it holds, and the last gap closed from it (what FTAR asks)."""

    def __init__(self, joiner: Joiner, gap: LastGap) -> None:
        self.joiner, self.gap = joiner, gap

    def finish(self) -> None:
        """Its first step is committed: let the source go."""
        self.joiner.finish()


__all__ = ["JoinEnd", "JoinSession", "Joined", "join_quorum"]
