"""FTAR: the fault-tolerant all-reduce of one step's gradients across replicas.

Control runs on the CPU in this process; the data moves over torch.distributed
(a gloo group per quorum; gloo cannot shrink, so a new quorum means a new
group). Two facts about gloo shape the design (../shared/MEASUREMENTS.md): a
collective whose peer died or hung may block until the group timeout, and
``abort()`` does not unblock it. So no collective is ever waited on blindly:
each one is waited on together with the coordinator's push, and when a newer
quorum arrives the collective is *abandoned* (left to time out on its own, its
buffers never reused) and the step continues in a new group among the
survivors, from the intact local gradients.

Agreement. On the fast path a step is one collective, the data all-reduce,
in place: a replica whose all-reduce completes commits its result at once.
The first collective in every new group is an *agree* instead: an all-gather
of each member's step, gradient size and model hash. A failure can leave the
survivors split, some having completed the step's all-reduce (and committed)
and some not; the agree shows it (steps differ by one), and the ones ahead
broadcast the sum they committed, which the others commit too. If none
completed it, all redo it among themselves from their intact local
gradients. Either way every survivor commits the same result, and the
average divides by the number of replicas whose gradients it contains.

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
import datetime
import logging
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from agent.ftar_decisions import (
    CONTROL_SLOTS,
    FOLLOW_HEAL,
    IN_PHASE,
    JOIN_IN_PHASE,
    MAX_SLOT_PROPOSAL,
    REPLAY_TO_BEFORE_HEAD,
    SERVE_LAST,
    TAKE_LAST,
    FtarError,
    agree_action,
    is_growth,
    slot_switch,
)
from coordinator.errors import FthsdpError
from protos.fthsdp.v1 import coordinator_pb2 as pb

__all__ = ["CONTROL_SLOTS", "FTAR", "Evicted", "FtarError", "FtarTimeout", "QuorumTracker", "StepResult"]

log = logging.getLogger("fthsdp.agent.ftar")


class Evicted(FthsdpError):
    """The coordinator's newest quorum no longer includes this replica (it was
    presumed dead, drained or restarted): its state must be caught up again."""


class FtarTimeout(FthsdpError):
    """No collective finished and no newer quorum came within the timeout."""


@dataclasses.dataclass(frozen=True)
class StepResult:
    total: torch.Tensor
    """The *sum* over the contributors: dividing is left to the caller, who
    can fuse it with copying the result back into the gradients."""
    contributors: int
    quorum_id: int
    abandoned: int
    """Collectives of this step that were abandoned for a newer quorum."""
    step: int = -1
    """The step this sum belongs to (a joiner that closed a gap is further on
    than the step it asked for)."""


class QuorumTracker:
    """The newest quorum this replica knows, fed by coordinator push events."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.cond = threading.Condition()
        self.quorum: pb.Quorum | None = None

    def update(self, event: pb.WatchEvent) -> None:
        with self.cond:
            if self.quorum is None or event.quorum.id > self.quorum.id:
                self.quorum = event.quorum
            self.cond.notify_all()

    def newest_id(self) -> int:
        return self.quorum.id if self.quorum is not None else 0

    def wait_for_membership(self, timeout: float, min_members: int = 1) -> pb.Quorum:
        """Block until a quorum of at least ``min_members`` includes this replica."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.includes_me(self.quorum) or len(self.quorum.members) < min_members:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(f"replica {self.replica_id} was not admitted into a quorum within {timeout:g}s")
                self.cond.wait(left)
            return self.quorum

    def includes_me(self, quorum: pb.Quorum | None) -> bool:
        return quorum is not None and any(m.replica_id == self.replica_id for m in quorum.members)


@dataclasses.dataclass
class _Group:
    quorum_id: int
    rank: int
    size: int
    pg: dist.ProcessGroup
    members: frozenset[str] = frozenset()


class _Prebuild:
    """A group built on a helper thread while training goes on in the old one."""

    def __init__(self, quorum_id: int, build: Callable[[], _Group]) -> None:
        self.quorum_id = quorum_id
        self.group: _Group | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.group = build()
            except BaseException as e:  # noqa: BLE001 - reported through ready()
                self.error = e
            finally:
                self.done.set()

        threading.Thread(target=run, name=f"fthsdp-ftar-prebuild-q{quorum_id}", daemon=True).start()

    def ready(self) -> bool:
        return self.done.is_set() and self.group is not None


_DONE, _NEWER = "done", "newer"

_EXACT_SLOT_DTYPES = (torch.float32, torch.float64)

PATIENCE_MIN = 2.0
PATIENCE_STEPS = 3
"""How long a collective (or a group's build) waits for a quorum's
members once a quorum that grows it is known: PATIENCE_STEPS of the longest
recent step, at least PATIENCE_MIN seconds. Members normally switch at an
agreed boundary long before; past it they abandon the group for the newest
quorum, which ends the rare case of a member that never saw the old quorum
(its push came too close to the next one's)."""


class FTAR:
    """All-reduce one flat gradient tensor per step across the quorum."""

    def __init__(
        self,
        tracker: QuorumTracker,
        job: str,
        shard_rank: int = 0,
        timeout: float = 60.0,
    ) -> None:
        self.tracker = tracker
        self.job = job
        self.shard_rank = shard_rank
        self.timeout = timeout
        self._group: _Group | None = None
        self._in_step_with = 0
        """The group whose members are known to be at the same step."""
        self._phase_contributors: int | None = None
        """How many members contribute to the step the last agree settled (None: all)."""
        self._last: StepResult | None = None
        self._last_step = -1
        # Abandoned groups are kept alive: destroying one whose collective is
        # still blocked could block the destructor on this thread.
        self._abandoned: list[tuple[float, _Group]] = []
        self._prebuilt: dict[int, _Prebuild] = {}
        """Groups of growth quorums, built in the background (by quorum id)."""
        self._controls: list[tuple[_Group, object, torch.Tensor]] = []
        """The control all-reduces of switch proposals of the last steps (see ``_settle_switch``)."""
        self._switch_to = 0
        """The growth quorum every member agreed to switch to at this step."""
        self._called: float | None = None
        self._intervals: list[float] = []
        self.on_behind: Callable[[int, int], int] | None = None
        """``on_behind(step, head)``: this replica has a gradient for
        ``step``, but the members are at ``head`` >= step + 2 (a replica
        admitted while it replayed). Brings it to ``head - 1``, where it
        takes the members' sum, and returns that step."""
        self.on_join: Callable[[int], Callable[[], int]] | None = None
        """``on_join(head)``: this replica, without a gradient, joins the
        members' data all-reduce of step ``head`` while it is behind it. Called
        before this replica's part of that all-reduce starts (the members
        wait in it: their hyperparameters for ``head`` are stable); returns a
        function, run while the all-reduce goes on, that replays up to
        ``head`` and returns that step."""
        self.while_joining: Callable[[], None] | None = None
        """Called before this replica, without a gradient, waits in a new
        group for the members to arrive: a joiner follows the log meanwhile,
        on a helper thread (the wait must never be held up by a replay;
        ``on_join`` stops it)."""

    # ----- the step ------------------------------------------------------------------

    def allreduce(
        self,
        step: int,
        buffer: torch.Tensor,
        structure_hash: int,
        refill: Callable[[], torch.Tensor] | None = None,
        contributes: bool = True,
        proposal: int | None = None,
        control_slots: bool = False,
    ) -> StepResult:
        """Sum ``buffer`` over the quorum for ``step``; see the module docstring.

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

        The data all-reduce runs in place in ``buffer`` (no copy on the fast
        path); a redo needs the local values again in a *fresh* tensor, since
        an abandoned collective may still write the old one: ``refill`` makes
        one (for example by flattening the intact gradients again). Without
        ``refill``, a copy of ``buffer`` is kept up front. The returned sum
        must be left unchanged until the next call: a replica that fell
        behind may need it.
        """
        if refill is None:
            original = buffer.detach().clone()
            refill = original.clone
        numel = buffer.numel() - (CONTROL_SLOTS if control_slots else 0)
        slots = control_slots and buffer.dtype in _EXACT_SLOT_DTYPES
        buffers = [buffer]
        now = time.monotonic()
        if self._called is not None:
            self._intervals = (self._intervals + [now - self._called])[-8:]
        self._called = now
        deadline = now + self.timeout
        abandoned = 0
        joining: int | None = None  # the members' step this joiner replays to during the all-reduce
        self._settle_switch(deadline)
        while True:
            group = self._current_group(deadline)
            if group.quorum_id == self._in_step_with:
                buf = buffers.pop() if buffers else refill()
                replay = self.on_join(joining) if joining is not None else None
                p = self.growth_ready() if proposal is None else proposal
                if slots:
                    d = p - group.quorum_id if 0 < p - group.quorum_id <= MAX_SLOT_PROPOSAL else 0
                    buf[numel:] = torch.tensor([d, d * d], dtype=buf.dtype)
                work = self._start(group, buf, dist.ReduceOp.SUM)
                control = None if slots else self._start_control(group, p)
                if replay is not None:
                    step, joining = replay(), None
                if self._wait_work(work, group, deadline) == _DONE:
                    contributors = self._phase_contributors or group.size
                    self._phase_contributors = None  # every member contributes from the next step on
                    if slots:
                        self._switch_from_slots(group, buf[numel:])
                    else:
                        self._controls.append(control)
                    total = buf[:numel] if control_slots else buf
                    self._last = StepResult(total, contributors, group.quorum_id, abandoned, step)
                    self._last_step = step
                    return self._last
                self._retire(group)
                abandoned += 1
                continue
            if not contributes and self.while_joining is not None:
                self.while_joining()
            rows = self._agree(group, step, numel, structure_hash, deadline, contributes)
            if rows is None:
                abandoned += 1
                continue
            action, arg = agree_action(step, contributes, [[int(x) for x in r] for r in rows], group.quorum_id)
            if action == IN_PHASE:
                self._phase_contributors = arg
                self._in_step_with = group.quorum_id  # the data all-reduce comes next
            elif action == JOIN_IN_PHASE:
                if self.on_join is None:
                    raise FtarError(f"this replica is at step {step}, the quorum at {arg}, and cannot catch up")
                self._phase_contributors = sum(1 for r in rows if r[5])
                self._in_step_with = group.quorum_id
                joining = arg
            elif action == REPLAY_TO_BEFORE_HEAD:
                # Admitted while still replaying: close the gap from the catch-up source.
                if self.on_behind is None:
                    raise FtarError(f"this replica is at step {step}, the quorum at {arg}, and cannot catch up")
                step = self.on_behind(step, arg)
            elif action == FOLLOW_HEAL:
                if self._broadcast(group, buffer.new_empty(numel), arg, deadline) is None:
                    abandoned += 1
            elif action == TAKE_LAST:
                result = self._catch_up_step(group, rows, step, buffer.new_empty(numel), arg, deadline)
                if result is not None:
                    return dataclasses.replace(result, abandoned=abandoned)
                abandoned += 1
            elif action == SERVE_LAST:
                if self._serve_last_step(group, step, buffer.new_empty(numel), arg, deadline) is None:
                    abandoned += 1
            # AGAIN, and after every action but TAKE_LAST: agree again.

    def _agree(self, group, step, numel, structure_hash, deadline, contributes=True):
        """All-gather every member's (step, size, model hash, last result's
        contributors and quorum, whether it contributes a gradient): the
        first collective in every new group."""
        last = self._last if self._last is not None and self._last_step == step - 1 else None
        row = torch.tensor(
            [step, numel, structure_hash, last.contributors if last else 0, last.quorum_id if last else 0, int(contributes)],
            dtype=torch.int64,
        )
        rows = [torch.zeros_like(row) for _ in range(group.size)]
        if self._wait_work(group.pg.allgather([rows], [row]), group, deadline) != _DONE:
            self._retire(group)
            return None
        sizes = {int(r[1]) for r in rows}
        if len(sizes) > 1:
            raise FtarError(
                f"replicas all-reduce gradients of different sizes ({min(sizes)}..{max(sizes)} elements; "
                f"this one {numel}): are they training the same model?"
            )
        if len({int(r[2]) for r in rows}) > 1:
            raise FtarError("replicas disagree on the model's parameters (names, shapes or dtypes differ)")
        return rows

    def _catch_up_step(self, group, rows, step, total, root, deadline) -> StepResult | None:
        """Others finished ``step`` (their data all-reduce completed before a
        failure stopped ours): take their sum, the one they applied, into ``total``."""
        if self._broadcast(group, total, root, deadline) != _DONE:
            return None
        self._last = StepResult(total, int(rows[root][3]), int(rows[root][4]), 0, step)
        self._last_step = step
        return self._last

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
        if self._wait_work(group.pg.broadcast([tensor], opts), group, deadline) == _DONE:
            return _DONE
        self._retire(group)
        return None

    # ----- growth: the agreed switch -------------------------------------------------

    def growth_ready(self) -> int:
        """The id of the newest quorum if it only adds replicas to the group
        this one trains in and its group is built here, else 0: the switch
        this rank proposes. Starts building that group if nobody has."""
        group = self._group
        with self.tracker.cond:
            quorum = self.tracker.quorum
        if group is None or self._in_step_with != group.quorum_id or not is_growth(group.members, quorum):
            return 0
        return quorum.id if self._prebuild(quorum).ready() else 0

    def _prebuild(self, quorum: pb.Quorum) -> _Prebuild:
        pre = self._prebuilt.get(quorum.id)
        if pre is None:
            pre = self._prebuilt[quorum.id] = _Prebuild(quorum.id, lambda: self._build(quorum))
        return pre

    def _switch_from_slots(self, group: _Group, summed: torch.Tensor) -> None:
        """The proposals carried in the data all-reduce (see CONTROL_SLOTS)."""
        total, squares = (int(round(float(x))) for x in summed)
        self._switch_to = slot_switch(group.quorum_id, group.size, total, squares)

    def _start_control(self, group: _Group, p: int):
        """After the data all-reduce, in the same group: (max, -min) of the proposals."""
        t = torch.tensor([p, -p], dtype=torch.int64)
        return group, self._start(group, t, dist.ReduceOp.MAX), t

    def _settle_switch(self, deadline: float) -> None:
        """Read the control all-reduce of the step before last: switch if
        every member proposed the same growth quorum. Not the last step's:
        this step's data all-reduce would wait for it (gloo runs a group's
        collectives in order) when steps follow each other closely; the one
        before last finished while the last step's data moved."""
        controls = [c for c in self._controls if c[0] is self._group and self._in_step_with == c[0].quorum_id]
        self._controls = controls
        if len(controls) < 2:
            return
        group, work, t = self._controls.pop(0)
        if self._wait_work(work, group, deadline) != _DONE:
            self._retire(group)
            return
        top, neg_bottom = int(t[0]), int(t[1])
        if top > 0 and top == -neg_bottom:
            self._switch_to = top

    # ----- groups --------------------------------------------------------------------

    def _current_group(self, deadline: float) -> _Group:
        """The group to run the next collective in: the current one while a
        quorum that only grows it waits for the agreed switch, else the
        newest quorum's (built if needed; the old one is abandoned)."""
        while True:
            with self.tracker.cond:
                quorum = self.tracker.quorum
            if quorum is None or not self.tracker.includes_me(quorum):
                raise Evicted(f"the newest quorum ({quorum.id if quorum else 'none'}) does not include this replica")
            group, switch_to, self._switch_to = self._group, self._switch_to, 0
            if group is not None and group.quorum_id == quorum.id:
                return group
            if group is not None and is_growth(group.members, quorum):
                target = self._prebuilt.get(switch_to)
                if target is None or not target.ready():
                    self._prebuild(quorum)
                    return group  # go on here until every member agrees to switch
                self._adopt(target.group)
                log.info("quorum %d: switched from quorum %d at a step boundary", target.quorum_id, group.quorum_id)
                return target.group
            if group is not None:
                self._retire(group)
            pre = self._prebuild(quorum)  # one build per quorum, whoever started it
            ids = frozenset(m.replica_id for m in quorum.members)
            if self._wait(pre.done.wait, quorum.id, ids, deadline) == _DONE:
                if pre.error is not None:
                    self._prebuilt.pop(quorum.id, None)
                    self._await_newer(quorum.id, deadline, pre.error)
                    continue
                self._adopt(pre.group)
                log.info("quorum %d: group of %d built", quorum.id, pre.group.size)
                return pre.group

    def _adopt(self, group: _Group) -> None:
        if self._group is not None and self._group is not group:
            self._retire(self._group)
        self._group = group
        self._in_step_with = 0  # the first collective in a new group is an agree
        self._prebuilt = {q: p for q, p in self._prebuilt.items() if q > group.quorum_id}

    def _retire(self, group: _Group) -> None:
        now = time.monotonic()
        # Past twice the timeout their collectives have ended: let them go.
        self._abandoned = [(t, g) for t, g in self._abandoned if now - t < 2 * self.timeout]
        self._abandoned.append((now, group))
        if self._group is group:
            self._group = None
        self._in_step_with = 0

    def _build(self, quorum: pb.Quorum) -> _Group:
        ids = [m.replica_id for m in quorum.members]
        rank = ids.index(self.tracker.replica_id)
        host, port = quorum.members[0].address.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=self.timeout)
        store = dist.TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timeout, wait_for_workers=False)
        prefix = dist.PrefixStore(f"fthsdp/{self.job}/q{quorum.id}/s{self.shard_rank}", store)
        pg = dist.ProcessGroupGloo(prefix, rank, len(ids), timeout)
        return _Group(quorum.id, rank, len(ids), pg, frozenset(ids))

    # ----- waiting -------------------------------------------------------------------

    def _start(self, group: _Group, tensor: torch.Tensor, op: dist.ReduceOp):
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        return group.pg.allreduce([tensor], opts)

    def _patience(self) -> float:
        longest = max(self._intervals, default=0.0)
        return min(self.timeout / 2, max(PATIENCE_MIN, PATIENCE_STEPS * longest))

    def _leave_for(self, members: frozenset[str], quorum_id: int, since: list[float]) -> bool:
        """Whether a collective among ``members`` (of ``quorum_id``) is left
        for the newest quorum: at once for one that drops a member; for one
        that only grows the group, after the patience (``since`` holds when
        it was first seen, and its id)."""
        newest = self.tracker.quorum
        if newest is None or newest.id <= quorum_id:
            return False
        if not since or since[1] != newest.id:
            if not is_growth(members, newest):
                return True
            self._prebuild(newest)
            since[:] = [since[0] if since else time.monotonic(), newest.id]
        if time.monotonic() - since[0] > self._patience():
            log.warning("quorum %d: no agreed switch to quorum %d in %.1fs; leaving for it", quorum_id, newest.id, self._patience())
            return True
        return False

    def _wait_work(self, work, group: _Group, deadline: float) -> str:
        """Poll a collective with a growing sleep (20 us to 1 ms): it costs no
        thread, and a newer quorum is seen within a millisecond. A newer
        quorum abandons it, except one that only grows the group: the members
        switch at an agreed step boundary instead (see ``_leave_for``)."""
        pause = 20e-6
        since: list[float] = []
        while not work.is_completed():
            if self._leave_for(group.members, group.quorum_id, since):
                return _NEWER
            if time.monotonic() > deadline:
                raise FtarTimeout(f"a collective in quorum {group.quorum_id} did not finish and no newer quorum came")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        try:
            work.wait()
        except RuntimeError as e:
            # The collective failed (a peer's connection dropped): the
            # coordinator will push the quorum without that peer.
            return self._await_newer(group.quorum_id, deadline, e)
        return _DONE

    def _await_newer(self, quorum_id: int, deadline: float, cause: BaseException) -> str:
        log.warning("collective in quorum %d failed (%s); waiting for a newer quorum", quorum_id, cause)
        with self.tracker.cond:
            while self.tracker.newest_id() <= quorum_id:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(f"a collective in quorum {quorum_id} failed ({cause}) and no newer quorum came")
                self.tracker.cond.wait(left)
        return _NEWER

    def _wait(self, blocking: Callable[[], object], quorum_id: int, members: frozenset[str], deadline: float) -> str:
        """Run ``blocking`` (a call with no handle to poll, like building the
        group of ``quorum_id``) on a helper thread; return DONE when it
        finishes, NEWER when a newer quorum makes this one's wait pointless
        (see ``_leave_for``)."""
        done = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                blocking()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                errors.append(e)
            finally:
                done.set()
                with self.tracker.cond:
                    self.tracker.cond.notify_all()

        threading.Thread(target=run, name="fthsdp-ftar-build", daemon=True).start()
        since: list[float] = []
        with self.tracker.cond:
            while not done.is_set():
                if self._leave_for(members, quorum_id, since):
                    return _NEWER
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(f"building the group of quorum {quorum_id} did not finish and no newer quorum came")
                self.tracker.cond.wait(min(left, 0.1) if since else left)
        if errors:
            return self._await_newer(quorum_id, deadline, errors[0])
        return _DONE
