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

from coordinator.errors import FthsdpError
from protos.fthsdp.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.ftar")


class FtarError(FthsdpError):
    """The replicas cannot agree on this step (a misuse, not a failure)."""


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


_DONE, _NEWER = "done", "newer"


# ----- the agreement, as a pure function -------------------------------------------------

AGAIN = "again"
"""Agree again (another member closes a gap first)."""
IN_PHASE = "in-phase"
"""Every member is at this step: the data all-reduce follows (arg: contributors)."""
REPLAY_TO_HEAD = "replay-to-head"
"""A joiner without a gradient: replay up to the members' step (arg), then agree again."""
REPLAY_TO_BEFORE_HEAD = "replay-to-before-head"
"""Two or more steps behind with a gradient: replay up to arg - 1, then agree again."""
FOLLOW_HEAL = "follow-heal"
"""A joiner takes part in the members' broadcast among themselves (arg: root)."""
TAKE_LAST = "take-last"
"""One step behind: receive the sum of this step from arg, and commit it."""
SERVE_LAST = "serve-last"
"""Others are one step behind: broadcast the sum of the last step (arg: root)."""


def agree_action(step: int, contributes: bool, rows: list[list[int]], quorum_id: int = 0) -> tuple[str, int]:
    """What this member does after an agree, from every member's row.

    A row is (step, gradient size, model hash, last sum's contributors, last
    sum's quorum id or 0 if not held, contributes this step). The members
    with a gradient (contributes) decide; joiners without one follow them,
    whatever step they are at. Every member reaches a decision whose next
    collective is the same as every other member's (tests/test_ftar_agree.py
    checks this over all small configurations): an all-gather (AGAIN and the
    replays), the data all-reduce (IN_PHASE), or one broadcast from the same
    root (FOLLOW_HEAL, TAKE_LAST, SERVE_LAST).
    """
    steps = [r[0] for r in rows]
    counted = [r[0] for r in rows if r[5]]
    if not counted:
        raise FtarError(f"no member of quorum {quorum_id} has a gradient for step {step}")
    lo, hi = min(counted), max(counted)

    def holder(at: int) -> int:
        """The first member at ``at`` that holds the sum of ``at - 1``."""
        for i, r in enumerate(rows):
            if r[0] == at and r[4] > 0:
                return i
        raise FtarError(f"quorum {quorum_id}: no member at step {at} holds the result of step {at - 1}")

    if not contributes:
        if lo < hi:
            return FOLLOW_HEAL, holder(hi)
        if step < hi:
            return REPLAY_TO_HEAD, hi
        if step == hi:
            return (AGAIN, 0) if any(s != step for s in steps) else (IN_PHASE, len(counted))
        raise FtarError(f"this replica is at step {step}, ahead of the quorum's {hi}")
    if lo == hi == step:
        return (AGAIN, 0) if any(s != step for s in steps) else (IN_PHASE, len(counted))
    if lo == step and hi >= step + 2:
        return REPLAY_TO_BEFORE_HEAD, hi
    if lo < step - 1 and hi == step:
        return AGAIN, 0
    if lo == step and hi == step + 1:
        return TAKE_LAST, holder(hi)
    if lo == step - 1 and hi == step:
        return SERVE_LAST, holder(step)
    raise FtarError(f"replicas in quorum {quorum_id} are at steps {lo}..{hi}, this one at {step}")


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
        self.on_behind: Callable[[int, int, bool], int] | None = None
        """``on_behind(step, head, to_head)``: this replica is at ``step``
        and the quorum's members at ``head`` (a joiner admitted mid-replay).
        Brings it to ``head`` (``to_head``: it has no gradient this step and
        joins the members' step) or to ``head - 1`` (its own gradient is for
        a step the others finished: it takes their sum of ``head - 1``), and
        returns that step."""

    # ----- the step ------------------------------------------------------------------

    def allreduce(
        self,
        step: int,
        buffer: torch.Tensor,
        structure_hash: int,
        refill: Callable[[], torch.Tensor] | None = None,
        contributes: bool = True,
    ) -> StepResult:
        """Sum ``buffer`` over the quorum for ``step``; see the module docstring.

        ``contributes=False``: this replica has no gradient for the step (a
        joiner whose forward pass ran on a state it has since replayed past);
        its ``buffer`` must hold zeros, and the result's ``contributors`` does
        not count it. Only a replica's first step in a new group can be one
        without a contribution (the agree tells the others).

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
        buffers = [buffer]
        deadline = time.monotonic() + self.timeout
        abandoned = 0
        while True:
            group = self._current_group(deadline)
            if group.quorum_id == self._in_step_with:
                buf = buffers.pop() if buffers else refill()
                if self._collective(group, buf, dist.ReduceOp.SUM, deadline) == _DONE:
                    contributors = self._phase_contributors or group.size
                    self._phase_contributors = None  # every member contributes from the next step on
                    self._last = StepResult(buf, contributors, group.quorum_id, abandoned, step)
                    self._last_step = step
                    return self._last
                self._in_step_with = 0
                abandoned += 1
                continue
            rows = self._agree(group, step, buffer.numel(), structure_hash, deadline, contributes)
            if rows is None:
                abandoned += 1
                continue
            action, arg = agree_action(step, contributes, [[int(x) for x in r] for r in rows], group.quorum_id)
            if action == IN_PHASE:
                self._phase_contributors = arg
                self._in_step_with = group.quorum_id  # the data all-reduce comes next
            elif action in (REPLAY_TO_HEAD, REPLAY_TO_BEFORE_HEAD):
                # Admitted while still replaying: close the gap from the catch-up source.
                if self.on_behind is None:
                    raise FtarError(f"this replica is at step {step}, the quorum at {arg}, and cannot catch up")
                step = self.on_behind(step, arg, action == REPLAY_TO_HEAD)
            elif action == FOLLOW_HEAL:
                if self._broadcast(group, torch.empty_like(buffer), arg, deadline) is None:
                    abandoned += 1
            elif action == TAKE_LAST:
                result = self._catch_up_step(group, rows, step, buffer, arg, deadline)
                if result is not None:
                    return dataclasses.replace(result, abandoned=abandoned)
                abandoned += 1
            elif action == SERVE_LAST:
                if self._serve_last_step(group, step, buffer, arg, deadline) is None:
                    abandoned += 1
            # AGAIN, and after every action but TAKE_LAST: agree again.

    def _agree(self, group: _Group, step: int, numel: int, structure_hash: int, deadline: float, contributes: bool = True):
        """All-gather every member's (step, size, model hash, last result's
        contributors and quorum, whether it contributes a gradient): the
        first collective in every new group."""
        last = self._last if self._last is not None and self._last_step == step - 1 else None
        row = torch.tensor(
            [step, numel, structure_hash, last.contributors if last else 0, last.quorum_id if last else 0, int(contributes)],
            dtype=torch.int64,
        )
        rows = [torch.zeros_like(row) for _ in range(group.size)]
        if self._wait_work(group.pg.allgather([rows], [row]), group.quorum_id, deadline) != _DONE:
            self._in_step_with = 0
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

    def _catch_up_step(self, group, rows, step, buffer, root, deadline) -> StepResult | None:
        """Others finished ``step`` (their data all-reduce completed before a
        failure stopped ours): take their sum, the one they applied."""
        total = torch.empty_like(buffer)
        if self._broadcast(group, total, root, deadline) != _DONE:
            return None
        self._last = StepResult(total, int(rows[root][3]), int(rows[root][4]), 0, step)
        self._last_step = step
        return self._last

    def _serve_last_step(self, group, step, buffer, root, deadline) -> str | None:
        """Some members are one step behind: the holder sends them the sum of
        ``step - 1``; the other members at ``step`` take part with a scratch
        tensor (a broadcast writes every non-root tensor)."""
        if group.rank == root:
            if self._last is None or self._last_step != step - 1:
                raise FtarError(f"step {step - 1}: other replicas need its result, but this one no longer holds it")
            tensor = self._last.total
        else:
            tensor = torch.empty_like(buffer)
        return self._broadcast(group, tensor, root, deadline)

    def _broadcast(self, group: _Group, tensor: torch.Tensor, root: int, deadline: float) -> str | None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        if self._wait_work(group.pg.broadcast([tensor], opts), group.quorum_id, deadline) == _DONE:
            return _DONE
        self._in_step_with = 0
        return None

    # ----- groups --------------------------------------------------------------------

    def _current_group(self, deadline: float) -> _Group:
        """The group of the newest quorum, built if needed; abandons older ones."""
        while True:
            with self.tracker.cond:
                quorum = self.tracker.quorum
            if quorum is None or not self.tracker.includes_me(quorum):
                raise Evicted(f"the newest quorum ({quorum.id if quorum else 'none'}) does not include this replica")
            if self._group is not None and self._group.quorum_id == quorum.id:
                return self._group
            if self._group is not None:
                now = time.monotonic()
                # Past twice the timeout their collectives have ended: let them go.
                self._abandoned = [(t, g) for t, g in self._abandoned if now - t < 2 * self.timeout]
                self._abandoned.append((now, self._group))
                self._group = None
            built: list[_Group] = []
            if self._wait(lambda: built.append(self._build(quorum)), quorum.id, deadline) == _DONE and built:
                self._group = built[0]
                log.info("quorum %d: group of %d built", quorum.id, self._group.size)
                return self._group

    def _build(self, quorum: pb.Quorum) -> _Group:
        ids = [m.replica_id for m in quorum.members]
        rank = ids.index(self.tracker.replica_id)
        host, port = quorum.members[0].address.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=self.timeout)
        store = dist.TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timeout, wait_for_workers=False)
        prefix = dist.PrefixStore(f"fthsdp/{self.job}/q{quorum.id}/s{self.shard_rank}", store)
        pg = dist.ProcessGroupGloo(prefix, rank, len(ids), timeout)
        return _Group(quorum.id, rank, len(ids), pg)

    # ----- waiting -------------------------------------------------------------------

    def _collective(self, group: _Group, tensor: torch.Tensor, op: dist.ReduceOp, deadline: float) -> str:
        """All-reduce ``tensor`` in place, abandoned if a newer quorum comes."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        return self._wait_work(group.pg.allreduce([tensor], opts), group.quorum_id, deadline)

    def _wait_work(self, work, quorum_id: int, deadline: float) -> str:
        """Poll a collective with a growing sleep (20 us to 1 ms): it costs no
        thread, and a newer quorum is seen within a millisecond."""
        pause = 20e-6
        while not work.is_completed():
            if self.tracker.newest_id() > quorum_id:
                return _NEWER
            if time.monotonic() > deadline:
                raise FtarTimeout(f"a collective in quorum {quorum_id} did not finish and no newer quorum came")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        try:
            work.wait()
        except RuntimeError as e:
            # The collective failed (a peer's connection dropped): the
            # coordinator will push the quorum without that peer.
            return self._await_newer(quorum_id, deadline, e)
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

    def _wait(self, blocking: Callable[[], object], quorum_id: int, deadline: float) -> str:
        """Run ``blocking`` (a call with no handle to poll, like building a
        group) on a helper thread; return DONE when it finishes, NEWER as soon
        as a quorum newer than ``quorum_id`` is known."""
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
        with self.tracker.cond:
            while not done.is_set():
                if self.tracker.newest_id() > quorum_id:
                    return _NEWER
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(f"building the group of quorum {quorum_id} did not finish and no newer quorum came")
                self.tracker.cond.wait(left)
        if errors:
            return self._await_newer(quorum_id, deadline, errors[0])
        return _DONE
