"""FTAR: the fault-tolerant all-reduce of one step's gradients across replicas.

Control runs on the CPU in this process; the data moves over torch.distributed
(a gloo group per quorum; gloo cannot shrink, so a new quorum means a new
group). Two facts about gloo shape the design (docs/measurements.md): a
collective whose peer died or hung may block until the group timeout, and
``abort()`` does not unblock it. So no collective is ever waited on blindly:
each one is waited on together with the coordinator's push, and when a newer
quorum arrives the collective is *abandoned* (left to time out on its own, its
buffers never reused) and the step continues in a new group among the
survivors, from the intact local gradients.

Agreement. On the fast path a step is two collectives in one group: the
data all-reduce, in place, then the commit vote, a small all-reduce that a
member starts once its sum completed, and after which it commits
(fthsdp/agent/training/ftar/vote.py: a completed vote proves every member holds the sum).
The first collective in every new group is an *agree* instead: an all-gather
of each member's step, gradient size and model hash, and whether it holds
an undecided sum of its step. A failure can leave the survivors split: some
committed the step (their vote completed), some hold its sum undecided
(their vote was abandoned), some never saw it complete. The ones ahead
broadcast the sum they committed; else the first holder broadcasts its sum
and every member votes on it; only if nobody holds it do the survivors redo
the step among themselves from their intact local gradients. Either way
every member that commits the step commits the same result, and the average
divides by the number of replicas whose gradients it contains.

The phases of a step (find the group, agree, the data all-reduce, the vote,
a broadcast, a request to the joiner) and the way from one to the next are a
pure state machine: fthsdp/agent/training/ftar/protocol.py; each phase is one
method of ``StepRun`` (fthsdp/agent/training/ftar/phases.py), run on the
transport's groups (fthsdp/agent/training/transport/; tests/test_ftar_phases.py
runs them in-process on a fake one).

Growth. A quorum that only adds replicas (a joiner admitted) abandons
nothing: the members build its group in the background while they keep
training in the old one, and switch at a step boundary they all agree on. A
small control all-reduce follows every step's data all-reduce (same group,
so it is done by the next step): each member proposes the newest growth
quorum whose group it has built, and the members switch when every proposal
is the same (the max and the min of the proposals agree). Every member reads
the same result, so they switch at the same step; a member that sees the
push a moment later than another never waits in a group the others left.
The joiner waits in the new group, following the log; when the members
arrive it joins their data all-reduce at once, without a gradient, and
replays the step or two it still lacks while that all-reduce runs.
"""

from __future__ import annotations

import logging

from fthsdp.agent.training.ftar.buckets import NO_BUCKETS, BucketPlan
from fthsdp.agent.training.ftar.carried import StepMemory
from fthsdp.agent.training.ftar.decisions import CONTROL_SLOTS, FtarError
from fthsdp.agent.training.ftar.groups import QuorumGroups
from fthsdp.agent.training.ftar.phases import StepRun
from fthsdp.agent.training.ftar.results import Joining, NotJoining, StepResult, StepSum
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.transport import Transport
from fthsdp.agent.training.transport.gloo import GlooTransport
from fthsdp.core.errors import Evicted, FtarTimeout

__all__ = [
    "CONTROL_SLOTS", "FTAR", "Evicted", "FtarError", "FtarTimeout", "Joining", "NotJoining", "QuorumView",
    "StepResult", "StepSum",
]

log = logging.getLogger("fthsdp.agent.ftar")


class FTAR:
    """All-reduce one flat gradient tensor per step across the quorum (the
    groups it runs in are kept by a ``QuorumGroups``). Owned by the training
    thread: it alone calls it, and it alone changes what one step leaves for
    the next (``memory``: fthsdp/agent/training/ftar/carried.py)."""

    def __init__(
        self,
        view: QuorumView,
        job: str,
        shard_rank: int = 0,
        timeout: float = 60.0,
        host: str = "",
        interface: str = "",
        transport: Transport | None = None,
        buckets: BucketPlan = NO_BUCKETS,
    ) -> None:
        """``transport``: what the quorums' groups are (fthsdp/agent/training/transport/);
        by default gloo, its pairs on ``host`` or ``interface``. ``buckets``: how this
        replica cuts its gradients (fthsdp/agent/training/ftar/overlap.py; none by default)."""
        self.view = view
        self.timeout = timeout
        self.groups = QuorumGroups(view, job, shard_rank, timeout,
                                   transport if transport is not None else GlooTransport(host, interface))
        self.memory = StepMemory(self.groups, buckets)

    @property
    def members_step(self) -> int:
        """The step the contributing members were last seen at in an agree."""
        return self.memory.members_step

    def growth_ready(self) -> int:
        """The growth quorum this rank proposes to switch to (see QuorumGroups.growth_ready)."""
        return self.groups.growth_ready()

    def allreduce(self, ask: StepSum, joining: Joining | None = None) -> StepResult:
        """Sum ``ask.buffer`` over the quorum for ``ask.step``; see the module
        docstring. ``joining``: what a joiner does when its first steps need it
        (None: this replica cannot catch up, and being behind is an error)."""
        return StepRun(self.memory, self.timeout, ask, joining).run()
