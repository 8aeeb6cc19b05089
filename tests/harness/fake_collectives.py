"""An in-process transport for FTAR whose collectives complete when a test says.

Each member of a quorum runs FTAR on a thread of its own, with a transport
from one ``FakeNetwork``. A group's collectives are matched by their order on
each member (as gloo's are). Once every member has posted one, its result is
computed; each member's part then *completes* (its output written, its work
``is_completed()``) when the network's ``director`` releases it: at once by
default, or in any order a test picks, with the coordinator's pushes
delivered in between. The director runs on a thread of its own and can wait
until a member has seen its part complete, or has left the group (FTAR
aborts a group it leaves): that makes every interleaving of "the all-reduce
completed here" and "a newer quorum came" reachable, deterministically.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport.pending import Built


@dataclasses.dataclass
class Op:
    """One collective of one group, as the members post it."""

    group: int
    """The group's id (the order it was built in)."""
    index: int
    """Its place among the group's collectives."""
    kind: str
    """allreduce, allgather or broadcast."""
    size: int
    posted: dict[int, tuple] = dataclasses.field(default_factory=dict)
    """By rank: (output tensors, input values, reduce op or root)."""
    results: dict[int, list[torch.Tensor]] = dataclasses.field(default_factory=dict)
    released: set[int] = dataclasses.field(default_factory=set)
    observed: set[int] = dataclasses.field(default_factory=set)

    @property
    def ready(self) -> bool:
        return len(self.posted) == self.size


class FakeNetwork:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.groups: dict[int, list[Op]] = {}
        self.left: set[tuple[int, int]] = set()
        """(group, rank): that rank aborted the group (it left it for a newer quorum)."""
        self.errors: list[BaseException] = []
        """What went wrong in a director's thread."""
        self.sizes: dict[int, int] = {}
        self.director: Callable[[Op], None] = self.release_all
        """Called once per collective, when every member has posted it."""
        self.on_observe: Callable[[Op, int], None] = lambda op, rank: None
        """Called the first time a rank sees its part of a collective completed, before it does."""

    def new_group(self, size: int) -> int:
        """A group's id is the order it was built in."""
        with self.lock:
            gid = len(self.sizes)
            self.sizes[gid], self.groups[gid] = size, []
            return gid

    def post(self, gid: int, rank: int, kind: str, outputs: list[torch.Tensor], values: list[torch.Tensor],
             how: object, counters: dict[int, int]) -> FakeWork:
        with self.lock:
            ops = self.groups[gid]
            index = counters[gid] = counters.get(gid, -1) + 1
            while len(ops) <= index:
                ops.append(Op(gid, len(ops), kind, self.sizes[gid]))
            op = ops[index]
            if op.kind != kind:
                raise AssertionError(f"group {gid} collective {index}: rank {rank} posted {kind}, another {op.kind}")
            op.posted[rank] = (outputs, [v.clone() for v in values], how)
            ready = op.ready
            if ready:
                _compute(op)
        if ready:
            threading.Thread(target=self._direct, args=(op,), name=f"fake-director-{gid}-{index}",
                             daemon=True).start()
        return FakeWork(self, op, rank)

    def _direct(self, op: Op) -> None:
        try:
            self.director(op)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            self.errors.append(e)

    def wait(self, until: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        """Wait (a director's thread) until ``until()`` holds; the network's state changes wake it."""
        with self.changed:
            if not self.changed.wait_for(until, timeout):
                raise AssertionError(f"fake network: no {what} within {timeout:g}s")

    def seen_or_left(self, op: Op, rank: int) -> bool:
        """Whether ``rank`` saw its part of ``op`` complete, or left its group."""
        with self.lock:
            return rank in op.observed or (op.group, rank) in self.left

    def abort(self, gid: int, rank: int) -> None:
        with self.changed:
            self.left.add((gid, rank))
            self.changed.notify_all()

    def release(self, op: Op, rank: int) -> None:
        """``rank``'s part of ``op`` completes: its outputs are written."""
        with self.lock:
            if rank in op.released:
                return
            for out, value in zip(op.posted[rank][0], op.results[rank], strict=True):
                out.copy_(value)
            op.released.add(rank)
            self.changed.notify_all()

    def release_all(self, op: Op) -> None:
        for rank in sorted(op.posted):
            self.release(op, rank)

    def completed(self, op: Op, rank: int) -> bool:
        with self.lock:
            if rank not in op.released:
                return False
            first = rank not in op.observed
        if first:
            self.on_observe(op, rank)
            with self.changed:
                op.observed.add(rank)
                self.changed.notify_all()
        return True


def _compute(op: Op) -> None:
    ranks = sorted(op.posted)
    if op.kind == "allreduce":
        values = [op.posted[r][1][0] for r in ranks]
        reduce_op = op.posted[ranks[0]][2]
        stacked = torch.stack(values)
        total = stacked.amax(0) if reduce_op == dist.ReduceOp.MAX else stacked.sum(0)
        op.results = {r: [total] for r in ranks}
    elif op.kind == "allgather":
        rows = [op.posted[r][1][0] for r in ranks]
        op.results = {r: rows for r in ranks}
    else:
        root = op.posted[ranks[0]][2]
        op.results = {r: [op.posted[root][1][0]] for r in ranks}


class FakeWork:
    def __init__(self, net: FakeNetwork, op: Op, rank: int) -> None:
        self.net, self.op, self.rank = net, op, rank

    def is_completed(self) -> bool:
        return self.net.completed(self.op, self.rank)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self.is_completed():
            raise RuntimeError("fake collective waited on before it completed")
        return True


class FakeGroup:
    """The collectives FTAR runs, on the fake network."""

    def __init__(self, net: FakeNetwork, gid: int, rank: int) -> None:
        self.net, self.gid, self.rank = net, gid, rank
        self._counters: dict[int, int] = {}

    def allreduce(self, tensors, opts) -> FakeWork:
        return self.net.post(self.gid, self.rank, "allreduce", tensors, tensors, opts.reduceOp, self._counters)

    def allgather(self, output_tensors, input_tensors) -> FakeWork:
        return self.net.post(self.gid, self.rank, "allgather", output_tensors[0], input_tensors, None, self._counters)

    def broadcast(self, tensors, opts) -> FakeWork:
        return self.net.post(self.gid, self.rank, "broadcast", tensors, tensors, opts.rootRank, self._counters)


class FakeTransport:
    """A Transport (fthsdp/agent/training/transport/) over a ``FakeNetwork``; the
    members of one quorum find its group through the quorum's store.

    ``in_place``: as the reconfigured gloo group
    (fthsdp/agent/training/transport/reconfigure.py): ``prepare`` exchanges
    the members' handles, and ``join`` points this member's one group
    object at the quorum's new network group."""

    name = "fake"
    device = torch.device("cpu")

    def __init__(self, net: FakeNetwork, in_place: bool = False) -> None:
        self.net = net
        self.in_place = in_place
        self.mine: FakeGroup | None = None
        """In place: this member's one group."""

    def prepare(self, store: dist.Store, rank: int, size: int, quorum_id: int, timeout: datetime.timedelta,
                grows: object | None = None) -> Built | _Rejoin:
        if not self.in_place:
            return Built(self.wrap(self.build(store, rank, size, timeout)))
        store.set(f"handle/{rank}", str(rank))
        store.wait([f"handle/{r}" for r in range(size)], timeout)
        return _Rejoin(self, store, rank, size)

    def wrap(self, group: FakeGroup) -> object:
        """What FTAR is given of a group (a subclass may wrap it)."""
        return group

    def held(self) -> tuple[object, ...]:
        return ()

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> FakeGroup:
        if rank == 0:
            store.set("fake/group", str(self.net.new_group(size)))
        return FakeGroup(self.net, int(store.get("fake/group")), rank)

    def abort(self, group: object) -> None:
        """Recorded (a test waits on it); like gloo's, an abandoned fake collective is left as it is."""
        assert isinstance(group, FakeGroup)
        self.net.abort(group.gid, group.rank)


class _Rejoin:
    """An in-place fake group's next quorum: every member joins at once, rank 0 making the network group."""

    def __init__(self, transport: FakeTransport, store: dist.Store, rank: int, size: int) -> None:
        self.transport, self.store, self.rank, self.size = transport, store, rank, size

    def join(self) -> object:
        """A rendezvous, as gloo's reconfigure: it returns once every member has come."""
        t = self.transport
        self.store.set(f"joined/{self.rank}", "1")
        self.store.wait([f"joined/{r}" for r in range(self.size)])
        if self.rank == 0:
            self.store.set("fake/group", str(t.net.new_group(self.size)))
        gid = int(self.store.get("fake/group"))
        if t.mine is None:
            t.mine = FakeGroup(t.net, gid, self.rank)
        else:
            t.mine.gid, t.mine.rank = gid, self.rank
        return t.wrap(t.mine)

    def drop(self) -> None:
        """Nothing is held."""
