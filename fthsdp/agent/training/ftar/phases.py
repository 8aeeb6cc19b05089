"""One step's sum, phase by phase: what each phase of the step protocol does.

``StepRun`` is one call of ``FTAR.allreduce`` (fthsdp/agent/training/ftar/allreduce.py).
Each phase is one method that runs one collective (or asks the joiner one
thing) and says how it ended (a ``PhaseEnd``); which phase follows is not
decided here but by the pure table of fthsdp/agent/training/ftar/protocol.py.
The phases read and write the step's own values on this object; what a
step leaves for the next (the last sum, the agreed contributors, the growth
proposals in flight) lives on the ``FTAR``, which owns it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import torch
from torch.profiler import record_function

from fthsdp.agent.training.ftar.carried import StepMemory
from fthsdp.agent.training.ftar.decisions import (
    CHECKPOINT_SLOT,
    CONTROL_SLOTS,
    MAX_SLOT_PROPOSAL,
    STALE_SLOT,
    AgreeAction,
    AgreeRow,
    FtarError,
    agree_action,
)
from fthsdp.agent.training.ftar.groups import DONE, QuorumGroup
from fthsdp.agent.training.ftar.overlap import Prelaunched
from fthsdp.agent.training.ftar.protocol import Phase, PhaseEnd, after
from fthsdp.agent.training.ftar.results import Joining, NotJoining, StepResult, StepSum
from fthsdp.agent.training.ftar.vote import vote as cast_vote
from fthsdp.agent.training.ftar.wire import broadcast, start_allreduce, start_sum

log = logging.getLogger("fthsdp.agent.ftar")

_EXACT_SLOT_DTYPES = (torch.float32, torch.float64)
"""Where the switch proposals ride in the data all-reduce (CONTROL_SLOTS): exact there."""


def read_slots(full: torch.Tensor, numel: int, control_slots: bool) -> tuple[float, ...]:
    """The summed control slots after ``numel`` elements, read to the host in one copy
    (on a GPU each element read on its own would be a synchronization of its own); () without slots."""
    return tuple(full[numel:].tolist()) if control_slots else ()


def held_sum(full: torch.Tensor, numel: int, slots: tuple[float, ...], contributors: int, quorum_id: int, step: int,
             overlapped: int) -> StepResult:
    """The complete sum in ``full`` (``slots``: its control slots after ``numel`` elements, as read), undecided."""
    wanted = bool(slots) and slots[CHECKPOINT_SLOT] > 0
    return StepResult(full[:numel] if slots else full, contributors, quorum_id, 0, step, wanted, overlapped)


class StepRun:
    """One step's sum across the quorum (see fthsdp/agent/training/ftar/allreduce.py)."""

    def __init__(self, memory: StepMemory, timeout: float, ask: StepSum, joining: Joining | None) -> None:
        self.memory, self.ask, self.groups = memory, ask, memory.groups
        self.joining: Joining = joining if joining is not None else NotJoining()
        self.idle: Callable[[], None] | None = joining.while_waiting if joining is not None else None
        """Runs between polls while this replica, without a gradient, waits in a new group."""
        self.step = ask.step
        """The step being summed (a joiner replays forward inside its first step)."""
        self.refill = ask.refill if ask.refill is not None else ask.buffer.detach().clone().clone
        self.numel = ask.buffer.numel() - (CONTROL_SLOTS if ask.control_slots else 0)
        self.slots = ask.control_slots and ask.buffer.dtype in _EXACT_SLOT_DTYPES
        """The switch proposal rides in the data all-reduce (else a control all-reduce follows it)."""
        self.buffers = [ask.buffer]
        """The buffer the first data all-reduce runs in; later attempts refill a fresh one."""
        self.prelaunched = ask.prelaunched
        now = time.monotonic()
        self.groups.note_step(now)
        self.deadline = now + timeout
        self.group: QuorumGroup | None = None
        self.abandoned = 0
        self.rows: list[torch.Tensor] = []
        """The last agree's rows, read by the phases it chose."""
        self.action: AgreeAction | None = None
        self.arg = 0
        """The last agree's action and its argument (a root, a step, a count)."""
        self.joining_head: int | None = None
        """The members' step this joiner replays to during the data all-reduce."""
        self.held: StepResult | None = None
        """The complete sum of the step this member holds, not decided yet (fthsdp/agent/training/ftar/vote.py)."""
        self.held_full: torch.Tensor | None = None
        """The tensor ``held`` is a view of, with the control slots."""
        self.slots_of_held: tuple[float, ...] | None = None
        """The data all-reduce's summed proposals, applied once the sum is decided."""
        self.result: StepResult | None = None

    def run(self) -> StepResult:
        self.memory.settle_switch(self.deadline)
        phase = Phase.FIND_GROUP
        while True:
            end = self._PHASES[phase](self)
            if end is PhaseEnd.ABANDONED:
                self.abandoned += 1
            phase = after(phase, end, self.action if phase is Phase.AGREE else None)
            if phase is Phase.DONE:
                assert self.result is not None  # DONE follows only a completed VOTE or TAKE_LAST, which set it
                return dataclasses.replace(self.result, abandoned=self.abandoned)
            if phase is Phase.NO_GRADIENT:
                # Nothing to sum: not a step; the caller runs it again with a gradient.
                quorum_id = self._group.quorum_id
                log.warning("quorum %d: no member has a gradient for step %d", quorum_id, self.step)
                self.groups.mark_in_step(None)  # the next call agrees again: the members' steps may differ
                return StepResult(self.ask.buffer.new_zeros(self.numel), 0, quorum_id, self.abandoned, self.step)

    @property
    def _group(self) -> QuorumGroup:
        assert self.group is not None  # FIND_GROUP comes first
        return self.group

    def _ended(self, done: bool) -> PhaseEnd:
        return PhaseEnd.COMPLETED if done else PhaseEnd.ABANDONED

    def _broadcast(self, tensor: torch.Tensor, root: int) -> bool:
        return broadcast(self.groups, self._group, tensor, root, self.deadline)

    # ----- the phases ------------------------------------------------------------------

    def find_group(self) -> PhaseEnd:
        """The newest group this rank can run the step in (built if needed)."""
        self.group = self.groups.current_group(self.deadline)
        return PhaseEnd.IN_STEP if self.groups.in_step(self.group) else PhaseEnd.NEW_GROUP

    def agree(self) -> PhaseEnd:
        """A new group's first collective: every member's ``AgreeRow``; ``agree_action`` says what follows."""
        group, ask = self._group, self.ask
        held = self.held if ask.contributes and self.held is not None and self.held.step == self.step else None
        # A joiner waiting for the members in a new group replays what they commit meanwhile.
        rows = self.memory.agree_rows(group, self.step, self.numel, ask.structure_hash, self.deadline,
                                    ask.contributes, None if ask.contributes else self.idle, held)
        if rows is None:
            return PhaseEnd.ABANDONED
        self.rows = rows
        self.action, self.arg = agree_action(self.step, ask.contributes, [[int(x) for x in r] for r in rows],
                                             group.quorum_id)
        self.joining_head = self.memory.settle_agree(group, rows, self.step, self.action, self.arg)
        return PhaseEnd.AGREED

    def data(self) -> PhaseEnd:
        """The data all-reduce (a joiner reads the members' inputs first and replays while it runs)."""
        group = self._group
        pre, self.prelaunched = self.prelaunched, None  # only the first attempt, and only in their group
        if pre is not None and pre.group is not group:
            pre = None
            self.buffers.clear()  # their all-reduces may still write it
        buf = self.buffers.pop() if self.buffers else self.refill()
        if self.joining_head is not None:
            self.joining.enter_step(self.joining_head)
        proposal = self.memory.growth_ready() if self.ask.proposal is None else self.ask.proposal
        self._fill_tail(buf, proposal, pre)
        # Prelaunched: the buckets run; the tail (statistics, control slots) follows them.
        works = ([*pre.works, start_allreduce(group, buf[pre.gradients:])] if pre is not None
                 else start_sum(group, buf, self.memory.buckets.slices))
        control = None if self.slots else self.memory.start_control(group, proposal)
        if self.joining_head is not None:
            self.step, self.joining_head = self.joining.replay_to(self.joining_head), None
        # The tail is waited for apart, to show what it costs after the buckets (benchmarks/step_profile.py).
        data, tail = (works[:-1], works[-1:]) if pre is not None else (works, [])
        with record_function("fthsdp.wait_data"):
            done = self._completed(data)
        if done:
            with record_function("fthsdp.wait_tail"):
                done = self._completed(tail)
        if not done:
            self.groups.retire(group)
            return PhaseEnd.ABANDONED
        return self._summed(buf, pre, control)

    def _completed(self, works: list) -> bool:
        return all(self.groups.wait_work(work, self._group, self.deadline) == DONE for work in works)

    def _fill_tail(self, buf: torch.Tensor, proposal: int, pre: Prelaunched | None) -> None:
        """The control slots (proposal, checkpoint, stale) and the ``first_only`` elements."""
        group, ask, numel = self._group, self.ask, self.numel
        if self.slots:
            d = proposal - group.quorum_id if 0 < proposal - group.quorum_id <= MAX_SLOT_PROPOSAL else 0
            buf[numel : numel + 2] = torch.tensor([d, d * d], dtype=buf.dtype)
        if ask.control_slots:
            buf[numel + CHECKPOINT_SLOT] = 1.0 if ask.checkpoint and ask.contributes else 0.0
            buf[numel + STALE_SLOT] = 1.0 if pre is not None and pre.stale else 0.0
        if ask.first_only is not None and group.rank != self.memory.first_contributor:
            buf[ask.first_only[0] : ask.first_only[1]].zero_()

    def _summed(self, buf: torch.Tensor, pre: Prelaunched | None, control) -> PhaseEnd:
        """The data all-reduce completed here: the sum is held, undecided (the vote follows)."""
        ftar, group = self.memory, self._group
        contributors = ftar.contributors_next or group.size
        ftar.contributors_next = None  # every member contributes from the next step on
        ftar.first_contributor = 0
        slots = read_slots(buf, self.numel, self.ask.control_slots)
        if pre is not None and slots and slots[STALE_SLOT] > 0:
            # A member's buckets carried a gradient that changed afterwards: all sum again.
            log.debug("quorum %d: step %d summed again (a gradient changed after its bucket left)",
                      group.quorum_id, self.step)
            if control is not None:
                ftar.controls.append(control)
            return PhaseEnd.STALE
        if self.slots:
            self.slots_of_held = slots
        else:
            assert control is not None  # started when the proposal has no slots
            ftar.controls.append(control)
        self.held = held_sum(buf, self.numel, slots, contributors, group.quorum_id, self.step,
                             pre.in_backward if pre is not None else 0)
        self.held_full = buf
        return PhaseEnd.COMPLETED

    def vote(self) -> PhaseEnd:
        """This member holds the step's complete sum: its vote decides, alone, by whether
        it completed (a completed vote means every member holds ``held``: vote.py)."""
        assert self.held is not None  # a vote follows only a completed DATA or TAKE_HELD
        began = time.monotonic()
        with record_function("fthsdp.vote"):
            decided = cast_vote(self.groups, self._group, self.deadline, self.memory.device)
        if decided is None:
            return PhaseEnd.ABANDONED  # ``held`` goes into the next group's agree
        if self.slots_of_held is not None:
            self.memory.switch_from_slots(self._group, self.slots_of_held)
        self.result = dataclasses.replace(self.held, vote_s=time.monotonic() - began)
        self.memory.remember(self.result, self.step)
        return PhaseEnd.COMPLETED

    def take_held(self) -> PhaseEnd:
        """Some members hold the step's sum undecided: the first holder broadcasts it and every
        member votes on it; nobody redoes a sum that someone may have committed (rule 2 of vote.py)."""
        group, root = self._group, self.arg
        if group.rank == root and self.held_full is None:
            raise FtarError("internal: chosen to send the sum it holds, but this member holds none")
        taken = self.held_full if group.rank == root else self.ask.buffer.new_empty(self.ask.buffer.numel())
        assert taken is not None
        if not self._broadcast(taken, root):
            return PhaseEnd.ABANDONED
        # The sum of the holders' quorum, decided by this group's vote: its quorum id is this
        # group's (a checkpoint's shares are split by the deciders).
        holder = AgreeRow(*(int(x) for x in self.rows[root]))
        self.held = held_sum(taken, self.numel, read_slots(taken, self.numel, self.ask.control_slots),
                             holder.held_contributors, group.quorum_id, self.step, 0)
        self.held_full, self.slots_of_held = taken, None
        return PhaseEnd.COMPLETED

    def follow_held(self) -> PhaseEnd:
        """A joiner takes part, without using it, in the members' TAKE_HELD broadcast."""
        return self._ended(self._broadcast(self.ask.buffer.new_empty(self.ask.buffer.numel()), self.arg))

    def follow_vote(self) -> PhaseEnd:
        """A joiner takes part, without committing, in the vote after a TAKE_HELD."""
        voted = cast_vote(self.groups, self._group, self.deadline, self.memory.device, decides=False)
        return self._ended(voted is not None)

    def close_gap(self) -> PhaseEnd:
        """Admitted while still replaying: the joiner closes the gap from its catch-up source."""
        self.step = self.joining.close_gap(self.step, self.arg)
        return PhaseEnd.ANSWERED

    def follow_heal(self) -> PhaseEnd:
        """A joiner takes part, without using it, in the broadcast to members one step behind."""
        return self._ended(self._broadcast(self.ask.buffer.new_empty(self.numel), self.arg))

    def take_last(self) -> PhaseEnd:
        """Others committed this step (their vote completed before a failure stopped ours):
        take their sum, the one they applied, with no vote (rule 1 of vote.py). Held here
        undecided too, its checkpoint request is this member's as well (the sum carried it)."""
        total, root = self.ask.buffer.new_empty(self.numel), self.arg
        if not self._broadcast(total, root):
            return PhaseEnd.ABANDONED
        holder, own = AgreeRow(*(int(x) for x in self.rows[root])), self.held
        self.result = StepResult(total, holder.last_contributors, holder.last_quorum, 0, self.step,
                                 own is not None and own.checkpoint and own.quorum_id == holder.last_quorum)
        self.memory.remember(self.result, self.step)
        return PhaseEnd.COMPLETED

    def serve_last(self) -> PhaseEnd:
        """Some members are one step behind: the holder sends them the sum of the step
        before; the other members at this step take part with a scratch tensor."""
        root, last = self.arg, self.memory.last_sum(self.step - 1)
        if self._group.rank == root and last is None:
            raise FtarError(f"step {self.step - 1}: other replicas need its result, but this one no longer holds it")
        tensor = last.total if self._group.rank == root and last is not None else self.ask.buffer.new_empty(self.numel)
        return self._ended(self._broadcast(tensor, root))

    _PHASES: dict[Phase, Callable[[StepRun], PhaseEnd]] = {
        Phase.FIND_GROUP: find_group,
        Phase.AGREE: agree,
        Phase.DATA: data,
        Phase.VOTE: vote,
        Phase.TAKE_HELD: take_held,
        Phase.FOLLOW_HELD: follow_held,
        Phase.FOLLOW_VOTE: follow_vote,
        Phase.CLOSE_GAP: close_gap,
        Phase.FOLLOW_HEAL: follow_heal,
        Phase.TAKE_LAST: take_last,
        Phase.SERVE_LAST: serve_last,
    }
    """Every phase that runs something (DONE and NO_GRADIENT end the step)."""
