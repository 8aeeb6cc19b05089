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

Agreement. A step's collectives in a group are an *agree* (a tiny MAX
all-reduce of the step number, the quorum id of a finished data all-reduce,
the gradient size and a hash of the model's structure) and the *data*
all-reduce. Each replica loops::

    agree -> all at my step, all hold the same finished result -> commit it
          -> all at my step otherwise                            -> data, then agree again
          -> others already committed this step                  -> commit my result (it is theirs)
          -> others one step behind                              -> agree again (they are committing)

A replica commits a data result only after an agree in which every member
reported holding it, or after seeing members that already did so; a
collective that completes on some replicas and not others therefore never
splits them: the laggards learn in the next group what the others committed.
The average divides by the number of replicas whose gradients it contains.
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
    average: torch.Tensor
    contributors: int
    quorum_id: int
    abandoned: int
    """Collectives of this step that were abandoned for a newer quorum."""


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
            while not self._includes_me(self.quorum) or len(self.quorum.members) < min_members:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(f"replica {self.replica_id} was not admitted into a quorum within {timeout:g}s")
                self.cond.wait(left)
            return self.quorum

    def _includes_me(self, quorum: pb.Quorum | None) -> bool:
        return quorum is not None and any(m.replica_id == self.replica_id for m in quorum.members)


@dataclasses.dataclass
class _Group:
    quorum_id: int
    rank: int
    size: int
    pg: dist.ProcessGroup


_DONE, _NEWER = "done", "newer"


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
        """The group in which every member committed the last step together."""
        # Abandoned groups are kept alive: destroying one whose collective is
        # still blocked could block the destructor on this thread.
        self._abandoned: list[_Group] = []

    # ----- the step ------------------------------------------------------------------

    def allreduce(self, step: int, local: torch.Tensor, structure_hash: int) -> StepResult:
        """Average ``local`` over the quorum for ``step``; see the module docstring."""
        deadline = time.monotonic() + self.timeout
        pending: tuple[int, torch.Tensor, int] | None = None  # (quorum id, sum, contributors)
        abandoned = 0
        while True:
            group = self._current_group(deadline)
            if pending is None and group.quorum_id == self._in_step_with:
                # Every member committed the previous step through the same
                # agree in this group, so all start this step with its data.
                pending, abandoned = self._data(group, local, deadline, pending, abandoned)
                continue
            rq = pending[0] if pending else 0
            numel = local.numel()
            agree = torch.tensor([step, -step, rq, -rq, numel, -numel, structure_hash, -structure_hash], dtype=torch.int64)
            if self._collective(group, agree, dist.ReduceOp.MAX, deadline) != _DONE:
                self._in_step_with = 0
                abandoned += 1
                continue
            max_step, min_step, max_rq, min_rq = int(agree[0]), -int(agree[1]), int(agree[2]), -int(agree[3])
            self._check_same_shape(agree, numel, structure_hash)
            if min_step == max_step == step:
                if pending is not None and min_rq == max_rq == pending[0]:
                    self._in_step_with = group.quorum_id
                    return self._result(pending, abandoned)
                pending, abandoned = self._data(group, local, deadline, None, abandoned)
                continue
            self._in_step_with = 0  # out of phase: the next step starts with an agree
            if min_step == step and max_step == step + 1:
                if pending is None:
                    raise FtarError(f"step {step}: other replicas committed it, but this one holds no result")
                return self._result(pending, abandoned)
            if min_step == step - 1 and max_step == step:
                continue  # the laggards are committing step - 1; meet them in the next agree
            raise FtarError(
                f"replicas in quorum {group.quorum_id} are at steps {min_step}..{max_step}, this one at {step}"
            )

    def _data(self, group: _Group, local: torch.Tensor, deadline: float, pending, abandoned: int):
        buf = local.detach().clone()  # a fresh buffer: an abandoned op may still write the old one
        if self._collective(group, buf, dist.ReduceOp.SUM, deadline) == _DONE:
            return (group.quorum_id, buf, group.size), abandoned
        self._in_step_with = 0
        return pending, abandoned + 1

    @staticmethod
    def _result(pending: tuple[int, torch.Tensor, int], abandoned: int) -> StepResult:
        quorum_id, total, contributors = pending
        return StepResult(total.div_(contributors), contributors, quorum_id, abandoned)

    @staticmethod
    def _check_same_shape(agree: torch.Tensor, numel: int, structure_hash: int) -> None:
        if int(agree[4]) != -int(agree[5]):
            raise FtarError(
                f"replicas all-reduce gradients of different sizes ({-int(agree[5])}..{int(agree[4])} elements; "
                f"this one {numel}): are they training the same model?"
            )
        if int(agree[6]) != -int(agree[7]):
            raise FtarError("replicas disagree on the model's parameters (names, shapes or dtypes differ)")

    # ----- groups --------------------------------------------------------------------

    def _current_group(self, deadline: float) -> _Group:
        """The group of the newest quorum, built if needed; abandons older ones."""
        while True:
            with self.tracker.cond:
                quorum = self.tracker.quorum
            if quorum is None or not self.tracker._includes_me(quorum):
                raise Evicted(f"the newest quorum ({quorum.id if quorum else 'none'}) does not include this replica")
            if self._group is not None and self._group.quorum_id == quorum.id:
                return self._group
            if self._group is not None:
                self._abandoned.append(self._group)
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
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        return self._wait(lambda: group.pg.allreduce([tensor], opts).wait(), group.quorum_id, deadline)

    def _wait(self, blocking: Callable[[], object], quorum_id: int, deadline: float) -> str:
        """Run ``blocking`` on a helper thread; return DONE when it finishes, NEWER
        as soon as a quorum newer than ``quorum_id`` is known. If it fails, wait
        for the newer quorum the coordinator will push."""
        done = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                blocking()
            except BaseException as e:  # noqa: BLE001 - reported to the waiting thread
                errors.append(e)
            finally:
                done.set()
                with self.tracker.cond:
                    self.tracker.cond.notify_all()

        threading.Thread(target=run, name="fthsdp-ftar-op", daemon=True).start()
        warned = False
        with self.tracker.cond:
            while True:
                if self.tracker.newest_id() > quorum_id:
                    return _NEWER
                if done.is_set() and not errors:
                    return _DONE
                left = deadline - time.monotonic()
                if left <= 0:
                    what = f"failed ({errors[0]})" if errors else "did not finish"
                    raise FtarTimeout(f"a collective in quorum {quorum_id} {what} and no newer quorum came")
                if errors and not warned:
                    log.warning("collective in quorum %d failed (%s); waiting for a newer quorum", quorum_id, errors[0])
                    warned = True
                self.tracker.cond.wait(left)
