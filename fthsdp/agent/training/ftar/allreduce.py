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
a broadcast, a request to a joiner's caller) and the way from one to the next
are a pure state machine: fthsdp/agent/training/ftar/protocol.py.

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

import dataclasses
import logging
import time
from collections.abc import Callable, Generator

import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar.decisions import (
    CHECKPOINT_SLOT,
    CONTROL_SLOTS,
    IN_PHASE,
    JOIN_IN_PHASE,
    MAX_SLOT_PROPOSAL,
    STALE_SLOT,
    AgreeAction,
    AgreeRow,
    FtarError,
    agree_action,
    slot_switch,
)
from fthsdp.agent.training.ftar.groups import DONE, QuorumGroups, QuorumTracker, _Group
from fthsdp.agent.training.ftar.overlap import Prelaunched
from fthsdp.agent.training.ftar.protocol import Phase, PhaseEnd, after
from fthsdp.agent.training.ftar.results import CloseGap, EnterStep, ReplayTo, Request, StepResult
from fthsdp.agent.training.ftar.vote import vote
from fthsdp.agent.training.transport import Transport
from fthsdp.agent.training.transport.gloo import GlooTransport
from fthsdp.core.errors import Evicted, FtarTimeout

__all__ = [
    "CONTROL_SLOTS", "FTAR", "CloseGap", "EnterStep", "Evicted", "FtarError", "FtarTimeout", "QuorumTracker",
    "ReplayTo", "Request", "StepResult",
]

log = logging.getLogger("fthsdp.agent.ftar")




_EXACT_SLOT_DTYPES = (torch.float32, torch.float64)

class FTAR:
    """All-reduce one flat gradient tensor per step across the quorum (the
    groups it runs in are kept by a ``QuorumGroups``)."""

    def __init__(
        self,
        tracker: QuorumTracker,
        job: str,
        shard_rank: int = 0,
        timeout: float = 60.0,
        host: str = "",
        interface: str = "",
        transport: Transport | None = None,
    ) -> None:
        """``transport``: what the quorums' groups are (fthsdp/agent/training/transport/);
        by default gloo, its pairs on ``host`` or ``interface``."""
        self.tracker = tracker
        self.timeout = timeout
        self.groups = QuorumGroups(tracker, job, shard_rank, timeout,
                                   transport if transport is not None else GlooTransport(host, interface))
        self._device = self.groups.transport.device
        """Where the agree rows and the control values go (the transport's device)."""
        self._phase_contributors: int | None = None
        """How many members contribute to the step the last agree settled (None: all)."""
        self._first_contributor = 0
        """The group rank whose ``first_only`` elements the step's sum carries (see ``operation``)."""
        self._last: StepResult | None = None
        self._last_step = -1
        self.members_step = -1
        """The step the contributing members were last seen at in an agree
        (a joiner learns the committed state's step from them)."""
        self.plan_signature = 0
        """This replica's bucket plan (fthsdp/agent/training/ftar/overlap.py), checked equal in every agree."""
        self.bucket_slices: tuple[tuple[int, int], ...] = ()
        """The buckets' slices of the gradient part, in the order they start: a sum run after the
        backward pass runs them too (``_start_sum``)."""
        self._controls: list[tuple[_Group, object, torch.Tensor]] = []
        """The control all-reduces of switch proposals of the last steps (see ``_settle_switch``)."""
    def growth_ready(self) -> int:
        """The growth quorum this rank proposes to switch to (see QuorumGroups.growth_ready)."""
        return self.groups.growth_ready()

    # ----- the step ------------------------------------------------------------------

    def allreduce(self, *args, serve: Callable[[Request], int | None] | None = None, **kwargs) -> StepResult:
        """Run ``operation(*args, **kwargs)`` to its result, answering its
        requests with ``serve`` (a replica that cannot catch up has none:
        a request is then an error)."""
        op = self.operation(*args, **kwargs)
        reply = None
        while True:
            try:
                request = op.send(reply)
            except StopIteration as done:
                return done.value
            if serve is None:
                raise FtarError(f"this replica is behind the quorum ({request}) and cannot catch up")
            reply = serve(request)

    def operation(
        self,
        step: int,
        buffer: torch.Tensor,
        structure_hash: int,
        refill: Callable[[], torch.Tensor] | None = None,
        contributes: bool = True,
        proposal: int | None = None,
        control_slots: bool = False,
        idle: Callable[[], None] | None = None,
        first_only: tuple[int, int] | None = None,
        checkpoint: bool = False,
        prelaunched: Prelaunched | None = None,
    ) -> Generator[Request, int | None, StepResult]:
        """Sum ``buffer`` over the quorum for ``step``; see the module docstring.
        A generator: it yields what this replica must do before it can go on
        (a ``Request``: replay to some step, read the members' inputs), is
        sent the answer, and returns the ``StepResult``.

        ``contributes=False``: this replica has no gradient for the step (a
        joiner whose forward pass ran on a state it has since replayed past);
        its ``buffer`` must hold zeros, and the result's ``contributors`` does
        not count it. Only a replica's first step in a new group can be one
        without a contribution (the agree tells the others).

        ``proposal``: the growth quorum this replica proposes to switch to
        after this step (see ``growth_ready``); by default this rank's own.
        The ranks of a multi-rank replica group must propose the same.
        ``control_slots``: ``buffer`` (and every ``refill``) ends in
        CONTROL_SLOTS spare elements that carry it; the result excludes them.
        ``checkpoint``: this member asks for a checkpoint at this step's
        boundary (with ``control_slots`` only); the result's ``checkpoint``
        says whether any member asked.
        ``prelaunched``: the step's buckets, started during the backward pass
        (fthsdp/agent/training/ftar/overlap.py); ``buffer`` must be their buffer, its tail filled.
        The step uses them if it runs in the group they were started in;
        otherwise they are dropped with that group and the step is summed
        flat from ``refill``.

        The data all-reduce runs in place in ``buffer`` (no copy on the fast
        path); a redo needs the local values again in a *fresh* tensor, since
        an abandoned collective may still write the old one: ``refill`` makes
        one (for example by flattening the intact gradients again). Without
        ``refill``, a copy of ``buffer`` is kept up front. The returned sum
        must be left unchanged until the next call: a replica that fell
        behind may need it. ``idle`` runs between polls while this replica,
        without a gradient, waits in a new group for the members to arrive (a
        joiner replays a step they committed meanwhile, if there is one, on
        this thread: one step at a time, so that it joins their next
        collective at most one replayed step late).

        ``first_only``: the elements ``[start, stop)`` of the buffer are summed
        from one member only, the first that contributes a gradient (group
        rank 0 unless a joiner without one holds it); the others zero them
        before the data all-reduce, so that the sum is that member's values
        exactly (batch-norm statistics: fthsdp/agent/training/state/running_buffers.py).
        """
        if refill is None:
            original = buffer.detach().clone()
            refill = original.clone
        numel = buffer.numel() - (CONTROL_SLOTS if control_slots else 0)
        slots = control_slots and buffer.dtype in _EXACT_SLOT_DTYPES
        buffers = [buffer]
        now = time.monotonic()
        self.groups.note_step(now)
        deadline = now + self.timeout
        abandoned = 0
        joining: int | None = None  # the members' step this joiner replays to during the all-reduce
        held: StepResult | None = None
        """The complete sum of ``step`` this member holds, not decided yet (fthsdp/agent/training/ftar/vote.py)."""
        held_full: torch.Tensor | None = None  # the tensor ``held`` is a view of, with the control slots
        slots_of_held: torch.Tensor | None = None  # the data all-reduce's summed proposals, applied once decided
        length = numel + (CONTROL_SLOTS if control_slots else 0)
        rows: list[torch.Tensor] = []  # the last agree's, read by the phases it chose
        self._settle_switch(deadline)
        phase, action, arg, result = Phase.FIND_GROUP, None, 0, None
        while True:
            # Run the phase (one collective, or one request to the caller); fthsdp/agent/training/ftar/protocol.py
            # decides what follows from how it ended.
            if phase is Phase.FIND_GROUP:
                group = self.groups.current_group(deadline)
                outcome = PhaseEnd.IN_STEP if self.groups.in_step(group) else PhaseEnd.NEW_GROUP
            elif phase is Phase.DATA:
                pre, prelaunched = prelaunched, None  # only the first attempt, and only in their group
                if pre is not None and pre.group is not group:
                    pre = None
                    buffers.clear()  # their all-reduces may still write it
                buf = buffers.pop() if buffers else refill()
                if joining is not None:
                    yield EnterStep(joining)
                p = self.growth_ready() if proposal is None else proposal
                if slots:
                    d = p - group.quorum_id if 0 < p - group.quorum_id <= MAX_SLOT_PROPOSAL else 0
                    buf[numel : numel + 2] = torch.tensor([d, d * d], dtype=buf.dtype)
                if control_slots:
                    buf[numel + CHECKPOINT_SLOT] = 1.0 if checkpoint and contributes else 0.0
                    buf[numel + STALE_SLOT] = 1.0 if pre is not None and pre.stale else 0.0
                if first_only is not None and group.rank != self._first_contributor:
                    buf[first_only[0] : first_only[1]].zero_()
                # Prelaunched: the buckets run; the tail (statistics, control slots) follows them.
                works = ([*pre.works, self._start(group, buf[pre.gradients:], dist.ReduceOp.SUM)]
                         if pre is not None else self._start_sum(group, buf))
                control = None if slots else self._start_control(group, p)
                if joining is not None:
                    reached = yield ReplayTo(joining)
                    assert reached is not None  # a ReplayTo is answered with the step reached
                    step, joining = reached, None
                if all(self.groups.wait_work(work, group, deadline) == DONE for work in works):
                    outcome = PhaseEnd.COMPLETED
                    contributors = self._phase_contributors or group.size
                    self._phase_contributors = None  # every member contributes from the next step on
                    self._first_contributor = 0
                    if pre is not None and control_slots and float(buf[numel + STALE_SLOT]) > 0:
                        # A member's buckets carried a gradient that changed afterwards: all sum again.
                        log.debug("quorum %d: step %d summed again (a gradient changed after its bucket left)",
                                  group.quorum_id, step)
                        if control is not None:
                            self._controls.append(control)
                        outcome = PhaseEnd.STALE
                        phase = after(phase, outcome)
                        continue
                    if slots:
                        slots_of_held = buf[numel:]
                    else:
                        assert control is not None  # started above when the proposal has no slots
                        self._controls.append(control)
                    # Complete here, but not decided: the vote follows (commit_vote.py).
                    held, held_full = self._held(buf, numel, contributors, group.quorum_id, step, control_slots,
                                                 pre.in_backward if pre is not None else 0), buf
                else:
                    self.groups.retire(group)
                    outcome = PhaseEnd.ABANDONED
            elif phase is Phase.VOTE:
                # Who decides: this member alone, by whether its vote completed; a completed
                # vote means every member of the group holds ``held`` (commit_vote.py).
                assert held is not None  # a vote follows only a completed DATA or TAKE_HELD
                began = time.monotonic()
                if vote(self.groups, group, deadline, self._device) is None:
                    outcome = PhaseEnd.ABANDONED  # ``held`` goes into the next group's agree
                else:
                    outcome = PhaseEnd.COMPLETED
                    if slots_of_held is not None:
                        self._switch_from_slots(group, slots_of_held)
                    result = self._last = dataclasses.replace(held, vote_s=time.monotonic() - began)
                    self._last_step = step
            elif phase is Phase.TAKE_HELD:
                # Who decides: every member, by the vote that follows; nobody redoes a sum that
                # someone may have committed (rule 2 of commit_vote.py).
                taken = self._take_held(group, arg, held_full, buffer, length, deadline)
                if taken is None:
                    outcome = PhaseEnd.ABANDONED
                else:
                    outcome = PhaseEnd.COMPLETED
                    # The sum of quorum held_quorum's members, decided by this group's vote: its
                    # quorum id is this group's (a checkpoint's shares are split by the deciders).
                    root = AgreeRow(*(int(x) for x in rows[arg]))
                    held, held_full, slots_of_held = self._held(
                        taken, numel, root.held_contributors, group.quorum_id, step, control_slots, 0), taken, None
            elif phase is Phase.FOLLOW_HELD:
                outcome = self._outcome(self._broadcast(group, buffer.new_empty(length), arg, deadline))
            elif phase is Phase.FOLLOW_VOTE:
                voted = vote(self.groups, group, deadline, self._device, decides=False)
                outcome = PhaseEnd.ABANDONED if voted is None else PhaseEnd.COMPLETED
            elif phase is Phase.AGREE:
                # A joiner waiting for the members in a new group replays what
                # they commit meanwhile, between polls of the agree.
                rows = self._agree(
                    group, step, numel, structure_hash, deadline, contributes, None if contributes else idle,
                    held if contributes and held is not None and held.step == step else None,
                )
                if rows is None:
                    outcome = PhaseEnd.ABANDONED
                else:
                    outcome = PhaseEnd.AGREED
                    action, arg = agree_action(step, contributes, [[int(x) for x in r] for r in rows], group.quorum_id)
                    joining = self._settle_agree(group, rows, step, action, arg)
            elif phase is Phase.CLOSE_GAP:
                # Admitted while still replaying: close the gap from the catch-up source.
                reached = yield CloseGap(step, arg)
                assert reached is not None  # a CloseGap is answered with the step reached
                step, outcome = reached, PhaseEnd.ANSWERED
            elif phase is Phase.FOLLOW_HEAL:
                outcome = self._outcome(self._broadcast(group, buffer.new_empty(numel), arg, deadline))
            elif phase is Phase.TAKE_LAST:
                # Another member committed this sum already (rule 1 of commit_vote.py): take it, no vote.
                result = self._catch_up_step(group, rows, step, buffer.new_empty(numel), arg, deadline, held)
                outcome = PhaseEnd.ABANDONED if result is None else PhaseEnd.COMPLETED
            elif phase is Phase.SERVE_LAST:
                outcome = self._outcome(self._serve_last_step(group, step, buffer.new_empty(numel), arg, deadline))
            if outcome is PhaseEnd.ABANDONED:
                abandoned += 1
            phase = after(phase, outcome, action if phase is Phase.AGREE else None)
            if phase is Phase.DONE:
                assert result is not None  # DONE follows only a completed DATA or TAKE_LAST, which set it
                return dataclasses.replace(result, abandoned=abandoned)
            if phase is Phase.NO_GRADIENT:
                # Nothing to sum: not a step; the caller runs it again with a gradient.
                log.warning("quorum %d: no member has a gradient for step %d", group.quorum_id, step)
                self.groups.mark_in_step(None)  # the next call agrees again: the members' steps may differ
                return StepResult(buffer.new_zeros(numel), 0, group.quorum_id, abandoned, step)

    @staticmethod
    def _outcome(done: str | None) -> PhaseEnd:
        return PhaseEnd.COMPLETED if done == DONE else PhaseEnd.ABANDONED

    def _settle_agree(self, group: _Group, rows, step: int, action: AgreeAction, arg: int) -> int | None:
        """What an agree settles for the data all-reduce that may follow;
        returns the members' step a joiner replays to during it (None: none)."""
        if action not in (IN_PHASE, JOIN_IN_PHASE):
            return None
        named = [AgreeRow(*(int(x) for x in r)) for r in rows]
        self._first_contributor = next(i for i, r in enumerate(named) if r.contributes)
        self._phase_contributors = arg if action == IN_PHASE else sum(1 for r in named if r.contributes)
        self.members_step = step if action == IN_PHASE else arg
        self.groups.mark_in_step(group)  # the data all-reduce comes next
        return arg if action == JOIN_IN_PHASE else None

    def _agree(self, group, step, numel, structure_hash, deadline, contributes=True, idle=None, held=None):
        """All-gather every member's ``AgreeRow`` (step, size, model hash, last result's
        contributors and quorum, whether it contributes a gradient, its bucket plan, the
        quorum and contributors of an undecided sum of ``step`` it holds): the
        first collective in every new group."""
        last = self._last if self._last is not None and self._last_step == step - 1 else None
        row = torch.tensor(
            [
                step, numel, structure_hash,
                last.contributors if last else 0, last.quorum_id if last else 0, int(contributes),
                self.plan_signature, held.quorum_id if held else 0, held.contributors if held else 0,
            ],
            dtype=torch.int64, device=self._device,
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

    def _catch_up_step(self, group, rows, step, total, root, deadline, own=None) -> StepResult | None:
        """Others committed ``step`` (their vote completed before a failure
        stopped ours): take their sum, the one they applied, into ``total``.
        ``own``: the same sum, held undecided here; its checkpoint request is
        then this member's too (the sum carried it to every member of the vote)."""
        if self._broadcast(group, total, root, deadline) != DONE:
            return None
        holder = AgreeRow(*(int(x) for x in rows[root]))
        self._last = StepResult(total, holder.last_contributors, holder.last_quorum, 0, step,
                                own is not None and own.checkpoint and own.quorum_id == holder.last_quorum)
        self._last_step = step
        return self._last

    @staticmethod
    def _held(full, numel, contributors, quorum_id, step, control_slots, overlapped) -> StepResult:
        """The complete sum in ``full`` (its control slots after ``numel`` elements), undecided."""
        wanted = control_slots and float(full[numel + CHECKPOINT_SLOT]) > 0
        return StepResult(full[:numel] if control_slots else full, contributors, quorum_id, 0, step, wanted,
                          overlapped)

    def _take_held(self, group, root, mine, template, length, deadline) -> torch.Tensor | None:
        """Every member is at this step and some hold its sum undecided: the
        first holder (``root``) broadcasts ``mine`` (the sum with its control
        slots); the others receive it into a fresh tensor like ``template``."""
        if group.rank == root and mine is None:
            raise FtarError("internal: chosen to send the sum it holds, but this member holds none")
        tensor = mine if group.rank == root else template.new_empty(length)
        return tensor if self._broadcast(group, tensor, root, deadline) == DONE else None

    def _serve_last_step(self, group, step, scratch, root, deadline) -> str | None:
        """Some members are one step behind: the holder sends them the sum of
        ``step - 1``; the other members at ``step`` take part with a
        ``scratch`` tensor (a broadcast writes every non-root tensor)."""
        if group.rank == root:
            if self._last is None or self._last_step != step - 1:
                raise FtarError(f"step {step - 1}: other replicas need its result, but this one no longer holds it")
            tensor = self._last.total
        else:
            tensor = scratch
        return self._broadcast(group, tensor, root, deadline)

    def _broadcast(self, group: _Group, tensor: torch.Tensor, root: int, deadline: float) -> str | None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        if self.groups.wait_work(group.pg.broadcast([tensor], opts), group, deadline) == DONE:
            return DONE
        self.groups.retire(group)
        return None

    def _start_sum(self, group: _Group, buf: torch.Tensor) -> list:
        """The step's sum after the backward pass, in the buckets' slices and then the tail, as
        the overlapped step runs it: gloo and NCCL add up an element in an order that depends on
        the length of the tensor it is in, so one flat all-reduce would give other bits. With the
        same slices a step summed after the backward pass (the first in a group, a joiner's, one
        redone after a restore) is bit for bit the step summed bucket by bucket."""
        end = max((stop for _, stop in self.bucket_slices), default=0)
        if not self.bucket_slices or end > buf.numel():
            return [self._start(group, buf, dist.ReduceOp.SUM)]
        works = [self._start(group, buf[start:stop], dist.ReduceOp.SUM) for start, stop in self.bucket_slices]
        if end < buf.numel():
            works.append(self._start(group, buf[end:], dist.ReduceOp.SUM))
        return works

    def _start(self, group: _Group, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType):
        opts = dist.AllreduceOptions()
        opts.reduceOp = op  # type: ignore[assignment]  # pybind11 converts it; torch's stubs do not say so
        return group.pg.allreduce([tensor], opts)

    # ----- growth: the agreed switch -------------------------------------------------

    def _switch_from_slots(self, group: _Group, summed: torch.Tensor) -> None:
        """The proposals carried in the data all-reduce (see CONTROL_SLOTS)."""
        total, squares = (int(round(float(x))) for x in summed[:2])
        self.groups.agree_switch(slot_switch(group.quorum_id, group.size, total, squares))

    def _start_control(self, group: _Group, p: int):
        """After the data all-reduce, in the same group: (max, -min) of the proposals."""
        t = torch.tensor([p, -p], dtype=torch.int64, device=self._device)
        return group, self._start(group, t, dist.ReduceOp.MAX), t

    def _settle_switch(self, deadline: float) -> None:
        """Read the control all-reduce of the step before last: switch if
        every member proposed the same growth quorum. Not the last step's:
        this step's data all-reduce would wait for it (gloo runs a group's
        collectives in order) when steps follow each other closely; the one
        before last finished while the last step's data moved."""
        controls = [c for c in self._controls if c[0] is self.groups.group and self.groups.in_step(c[0])]
        self._controls = controls
        if len(controls) < 2:
            return
        group, work, t = self._controls.pop(0)
        if self.groups.wait_work(work, group, deadline) != DONE:
            self.groups.retire(group)
            return
        top, neg_bottom = int(t[0]), int(t[1])
        if top > 0 and top == -neg_bottom:
            self.groups.agree_switch(top)
