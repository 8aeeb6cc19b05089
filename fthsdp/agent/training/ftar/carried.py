"""What one step of FTAR leaves for the next, and the cross-step collectives.

Owned by the training thread: ``FTAR`` (fthsdp/agent/training/ftar/allreduce.py)
holds one, and the phases of each step (fthsdp/agent/training/ftar/phases.py)
read and change it on that thread alone: the last committed sum (a member one
step behind may need it), what the last agree settled for the data
all-reduce, and the growth proposals in flight.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar.buckets import BucketPlan
from fthsdp.agent.training.ftar.decisions import IN_PHASE, JOIN_IN_PHASE, AgreeAction, AgreeRow, FtarError, slot_switch
from fthsdp.agent.training.ftar.groups import DONE, QuorumGroup, QuorumGroups
from fthsdp.agent.training.ftar.results import StepResult
from fthsdp.agent.training.ftar.wire import start_allreduce


class StepMemory:
    """The state FTAR carries from one step to the next, over its groups."""

    def __init__(self, groups: QuorumGroups, buckets: BucketPlan) -> None:
        self.groups = groups
        self.buckets = buckets
        """Checked equal in every agree; a step summed after the backward pass runs in its slices."""
        self.device = groups.transport.device
        """Where the agree rows and the control values go (the transport's device)."""
        self.last: StepResult | None = None
        """The last sum this member committed (a member one step behind may need it)."""
        self.last_step = -1
        self.contributors_next: int | None = None
        """How many members contribute to the step the last agree settled (None: all)."""
        self.first_contributor = 0
        """The group rank whose ``first_only`` elements the step's sum carries (``StepSum.first_only``)."""
        self.members_step = -1
        """The step the contributing members were last seen at in an agree
        (a joiner learns the committed state's step from them)."""
        self.controls: list[tuple[QuorumGroup, object, torch.Tensor]] = []
        """The control all-reduces of switch proposals of the last steps (see ``settle_switch``)."""

    def growth_ready(self) -> int:
        """The growth quorum this rank proposes to switch to (see QuorumGroups.growth_ready)."""
        return self.groups.growth_ready()

    def remember(self, result: StepResult, step: int) -> None:
        """``result`` is committed as the sum of ``step``."""
        self.last, self.last_step = result, step

    def last_sum(self, step: int) -> StepResult | None:
        """The committed sum of ``step``, if this member still holds it."""
        return self.last if self.last is not None and self.last_step == step else None

    def settle_agree(self, group: QuorumGroup, rows, step: int, action: AgreeAction, arg: int) -> int | None:
        """What an agree settles for the data all-reduce that may follow;
        returns the members' step a joiner replays to during it (None: none)."""
        if action not in (IN_PHASE, JOIN_IN_PHASE):
            return None
        named = [AgreeRow(*(int(x) for x in r)) for r in rows]
        self.first_contributor = next(i for i, r in enumerate(named) if r.contributes)
        self.contributors_next = arg if action == IN_PHASE else sum(1 for r in named if r.contributes)
        self.members_step = step if action == IN_PHASE else arg
        self.groups.mark_in_step(group)  # the data all-reduce comes next
        return arg if action == JOIN_IN_PHASE else None

    def agree_rows(self, group: QuorumGroup, step: int, numel: int, structure_hash: int, deadline: float,
                   contributes: bool = True, idle=None, held: StepResult | None = None) -> list[torch.Tensor] | None:
        """All-gather every member's ``AgreeRow`` (step, size, model hash, last result's
        contributors and quorum, whether it contributes a gradient, its bucket plan, the
        quorum and contributors of an undecided sum of ``step`` it holds): the
        first collective in every new group. None if abandoned for a newer quorum."""
        last = self.last_sum(step - 1)
        row = torch.tensor(
            [
                step, numel, structure_hash,
                last.contributors if last else 0, last.quorum_id if last else 0, int(contributes),
                self.buckets.signature, held.quorum_id if held else 0, held.contributors if held else 0,
            ],
            dtype=torch.int64, device=self.device,
        )
        rows = [torch.zeros_like(row) for _ in range(group.size)]
        if self.groups.wait_work(group.pg.allgather([rows], [row]), group, deadline, idle) != DONE:
            self.groups.retire(group)
            return None
        rows = list(torch.stack(rows).cpu())  # one copy from the device (NCCL), not one per element
        named = [AgreeRow(*(int(x) for x in r)) for r in rows]
        sizes = {r.numel for r in named}
        if len(sizes) > 1:
            raise FtarError(
                f"replicas all-reduce gradients of different sizes ({min(sizes)}..{max(sizes)} elements; "
                f"this one {numel}): are they training the same model?"
            )
        if len({r.structure for r in named}) > 1:
            raise FtarError("replicas disagree on the model's parameters (names, shapes or dtypes differ)")
        if len({r.plan for r in named}) > 1:
            raise FtarError("replicas cut the gradients into different buckets: give every agent the same "
                            "--bucket-cap-mb")
        return rows

    # ----- growth: the agreed switch -------------------------------------------------

    def switch_from_slots(self, group: QuorumGroup, summed: Sequence[float]) -> None:
        """The proposals carried in the data all-reduce (see CONTROL_SLOTS), as read to the host."""
        total, squares = (int(round(x)) for x in summed[:2])
        self.groups.agree_switch(slot_switch(group.quorum_id, group.size, total, squares))

    def start_control(self, group: QuorumGroup, p: int):
        """After the data all-reduce, in the same group: (max, -min) of the proposals."""
        t = torch.tensor([p, -p], dtype=torch.int64, device=self.device)
        return group, start_allreduce(group, t, dist.ReduceOp.MAX), t

    def settle_switch(self, deadline: float) -> None:
        """Read the control all-reduce of the step before last: switch if
        every member proposed the same growth quorum. Not the last step's:
        this step's data all-reduce would wait for it (gloo runs a group's
        collectives in order) when steps follow each other closely; the one
        before last finished while the last step's data moved."""
        controls = [c for c in self.controls if c[0] is self.groups.group and self.groups.in_step(c[0])]
        self.controls = controls
        if len(controls) < 2:
            return
        group, work, t = self.controls.pop(0)
        if self.groups.wait_work(work, group, deadline) != DONE:
            self.groups.retire(group)
            return
        top, neg_bottom = int(t[0]), int(t[1])
        if top > 0 and top == -neg_bottom:
            self.groups.agree_switch(top)
