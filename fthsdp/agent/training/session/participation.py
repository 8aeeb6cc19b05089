"""A replica's place in the next step's all-reduce: how many replicas'
gradients it is expected to average, and this replica's index among them.

A training script that keeps its global batch constant splits it by these
(replica ``index`` takes the ``index``-th of ``count`` equal shares), so
every member must compute the same pair for a step without talking to the
others. The newest quorum pushed by the coordinator is not such a value:
members see a push at slightly different times, and a joiner's quorum is
only switched to at a step boundary the members agree on (its first step
contributes no gradient). The quorum the *last step was committed in* is:
every member of a step commits it in the same quorum, and a member that
took the step's sum from another after a failure records the other's
quorum. So the basis of step ``s`` is the quorum of step ``s - 1`` (for the
first step, the quorum that admitted the replica), and the index is the
replica's rank in it, which the coordinator pushed with it (``place``).

What it cannot know is a failure during the step: a member lost meanwhile
leaves ``count`` above the number of gradients the step finally averages
(``StepResult.contributors``), and its share of the batch is not trained on
in that step. The next step's basis no longer includes it.
"""

from __future__ import annotations

import dataclasses

from fthsdp.agent.training.quorum_view import QuorumView


@dataclasses.dataclass(frozen=True)
class Participation:
    """This replica's place in the next ``allreduce_gradients()``."""

    index: int
    """This replica's position among the ``count`` replicas (0-based, the same order on every member)."""
    count: int
    """Replicas whose gradients the next all-reduce is expected to average."""
    contributes: bool = True
    """False for a joiner's first step: its gradient is not used (it joins the
    members' step without one), and ``index``/``count`` are only an estimate
    of its place once admitted."""


def participation(view: QuorumView, basis: int, joining: bool) -> Participation:
    """The place of this replica in quorum ``basis`` (see the module
    docstring); for a joiner not yet in one (``joining``), its place in
    the newest quorum that includes it, or at the end of the newest."""
    with view.cond:  # one push's places, not two
        place = view.place_in(basis)
        if not joining and place is not None:
            return Participation(*place)
        newest = view.newest_place()
        if newest is not None:
            return Participation(*newest, contributes=not joining)
        count = view.newest_count() + 1
        return Participation(count - 1, count, contributes=False)
