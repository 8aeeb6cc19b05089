"""The cross-replica group reconfigured in place, per quorum (torch >= 2.14).

torch 2.14 lets one gloo group change its peers in place:
``ProcessGroupGloo(..., enable_reconfigure=True)`` builds a backend with no
peers, and ``dist._reconfigure(uuid, handles, group)`` connects it to the
members whose handles (``dist._get_reconfigure_handle``) it is given, the
list's order being the ranks. So a replica keeps one group for the life of
its process, and a quorum change costs one rendezvous (1-12 ms here), not a
new group with its own threads and sockets.

How a quorum's members meet (``prepare``, then ``Pending.join``):

* **The store.** A reconfigurable group keeps, for life, the store it was
  built with, while the store a quorum meets on is its first member's (a
  TCPStore in that replica's process, which may die). So the group is built
  on a ``ForwardingStore`` that is pointed at the quorum's store, under the
  quorum's own prefix, before each reconfigure. The uuid is the quorum id:
  quorum ids never repeat in a job (the coordinator keeps them in etcd), and
  the prefix is the quorum's too, so a reconfigure never reads another's
  rendezvous keys (gloo catches a reused uuid only on the new rank 0; the
  others would connect to stale state).
* **The handles.** A handle names the member's current rank and uuid, so it
  changes after every reconfigure. Each member writes its own under the
  quorum's prefix and reads the others' there: always the current ones,
  with no round trip through the coordinator after each change.
* **Growth without a stall.** For a quorum that only adds replicas, the
  members write their handles while they train on; the quorum is ready when
  every member's handle is there (the joiners write theirs when they are
  ready to meet), and the members reconfigure at the step boundary they
  agreed on (fthsdp/agent/training/ftar/groups.py), as they switched to a
  group built in the background before.

**One object, unless collectives are left running.** A peer that is hung,
not dead, leaves its collectives queued in the group until the group's
timeout, and ``abort()`` does not end them (docs/measurements.md); gloo runs
a group's work on two threads, so a reconfigured group would queue the new
quorum's collectives behind them. A group with collectives still running
is set aside until they end, and the quorum meets in another group of the
pool (``GroupPool``): another group costs no more to meet in (a
reconfigure connects afresh either way). A join keeps the one group, and so
does a kill whose collectives have failed by then (a dead peer's fail
within tens of milliseconds; one that waits on another survivor ends when
that survivor reconfigures).

Experimental in torch (the calls are ``_``-prefixed there): the transport
is chosen at start (``choose``, fthsdp/agent/training/transport/__init__.py)
where torch has them, with one log line, and the group built per quorum
(fthsdp/agent/training/transport/gloo.py) stays for the torch versions
without.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport.gloo import GlooTransport

log = logging.getLogger("fthsdp.agent.transport")

API = ("_reconfigure", "_get_reconfigure_handle", "_supports_reconfigure")
"""torch.distributed's reconfigure calls (torch >= 2.14, experimental)."""


def supported() -> bool:
    """Whether this torch can reconfigure a gloo group in place."""
    return all(hasattr(dist, name) for name in API)


def _call(name: str) -> Callable[..., Any]:
    """One of ``API``, looked up when called: absent from older torch (and its type stubs)."""
    return cast(Callable[..., Any], getattr(dist, name))


class ForwardingStore(dist.Store):
    """A store that forwards every call to the one it is pointed at: what a
    reconfigurable group is built on, since it keeps its store for life."""

    def __init__(self) -> None:
        super().__init__()
        self._target: dist.Store | None = None

    def point(self, target: dist.Store) -> None:
        self._target = target

    def _to(self) -> dist.Store:
        if self._target is None:
            raise RuntimeError("the forwarding store is not pointed at a quorum's store yet")
        return self._target

    def set(self, key, value):
        return self._to().set(key, value)

    def get(self, key):
        return self._to().get(key)

    def add(self, key, value):
        return self._to().add(key, value)

    def compare_set(self, key, expected, desired):
        return self._to().compare_set(key, expected, desired)

    def multi_get(self, keys):
        return self._to().multi_get(keys)

    def multi_set(self, keys, values):
        return self._to().multi_set(keys, values)

    def wait(self, keys, timeout=None):
        return self._to().wait(keys) if timeout is None else self._to().wait(keys, timeout)

    def check(self, keys):
        return self._to().check(keys)

    def delete_key(self, key):
        return self._to().delete_key(key)

    def num_keys(self):
        return self._to().num_keys()

    def set_timeout(self, timeout):
        return self._to().set_timeout(timeout)


class ReconfiguredGroup:
    """One reconfigurable gloo backend and the collectives run in it (FTAR's ``Collectives``).

    It remembers the collectives it started, to know when it is idle: a
    group is reconfigured only with none of them running."""

    def __init__(self, backend: object, store: ForwardingStore, number: int) -> None:
        self._backend = backend
        self._store = store
        self.number = number
        """This group's place in the process's pool (0: the first), for the log."""
        self._works: list[dist.Work] = []
        self._lock = threading.Lock()
        self.reconfiguring = False
        self.last_used = 0.0
        self.quorum_id = 0
        """The quorum this group was last reconfigured for (its uuid); 0 before."""

    def _track(self, work: dist.Work) -> dist.Work:
        with self._lock:
            self._works = [w for w in self._works if not w.is_completed()]
            self._works.append(work)
        return work

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work:
        return self._track(self._backend.allreduce(tensors, opts))  # type: ignore[attr-defined]

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor]) -> dist.Work:
        return self._track(self._backend.allgather(output_tensors, input_tensors))  # type: ignore[attr-defined]

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work:
        return self._track(self._backend.broadcast(tensors, opts))  # type: ignore[attr-defined]

    def running(self) -> int:
        """Collectives started in this group that have not ended."""
        with self._lock:
            self._works = [w for w in self._works if not w.is_completed()]
            return len(self._works)

    def handle(self) -> str:
        return str(_call("_get_reconfigure_handle")(self._backend))

    def reconfigure(self, store: dist.Store, quorum_id: int, handles: list[str], timeout: datetime.timedelta) -> None:
        """Connect to the members whose handles are listed (this one's among
        them), meeting on ``store``; raises if they do not all come within
        ``timeout`` (the group then keeps its old peers)."""
        self._store.point(store)
        _call("_reconfigure")(uuid=quorum_id, handles=handles, group=self._backend, timeout=timeout).wait()
        self.quorum_id = quorum_id

    def rank(self) -> int:
        return int(self._backend.rank())  # type: ignore[attr-defined]

    def size(self) -> int:
        return int(self._backend.size())  # type: ignore[attr-defined]


class GroupPool:
    """The groups of one process: normally one, reconfigured per quorum."""

    def __init__(self, make: Callable[[ForwardingStore, int, datetime.timedelta], object]) -> None:
        """``make(store, stable_rank, timeout)``: a reconfigurable backend on ``store``."""
        self._make = make
        self._groups: list[ReconfiguredGroup] = []
        self._lock = threading.Lock()
        self._numbers = itertools.count()

    @property
    def groups(self) -> tuple[ReconfiguredGroup, ...]:
        with self._lock:
            return tuple(self._groups)

    def take(self, prefer: ReconfiguredGroup | None, timeout: datetime.timedelta) -> ReconfiguredGroup:
        """The group a new quorum meets in, marked as reconfiguring: ``prefer``
        (the group of the quorum it grows, which trains on until the switch),
        else the most recently used group with no collective running, else a
        new one (whose collectives time out after ``timeout``). Not waiting for
        the last group's collectives to end is deliberate: after a kill, a
        survivor's collective waits on another survivor, which ends it only by
        reconfiguring, which waits for this member's handle (measured: a
        wait of 0.1 s expired in 3 kills of 4, and cost the kill those 0.1 s)."""
        with self._lock:
            candidates = [prefer] if prefer is not None else sorted(
                self._groups, key=lambda g: g.last_used, reverse=True)
            for group in candidates:
                if not group.reconfiguring and (group is prefer or group.running() == 0):
                    group.reconfiguring = True
                    return group
            if self._groups:
                log.info("the cross-replica group still has %d collectives of an abandoned quorum running "
                         "(until a peer's reconfigure or the group's timeout ends them): this quorum meets in "
                         "another group", max(g.running() for g in self._groups))
            # The stable rank names this process's handles; a random one keeps two
            # fresh processes of one quorum apart (their handles would be equal).
            store = ForwardingStore()
            group = ReconfiguredGroup(self._make(store, secrets.randbits(31), timeout), store, next(self._numbers))
            group.reconfiguring = True
            self._groups.append(group)
            return group

    def give_back(self, group: ReconfiguredGroup) -> None:
        with self._lock:
            group.reconfiguring = False
            group.last_used = time.monotonic()


class Reconfiguring:
    """A quorum's meeting in a reconfigured group: handles written, awaiting ``join``."""

    def __init__(self, pool: GroupPool, group: ReconfiguredGroup, store: dist.Store, quorum_id: int,
                 handles: list[str], timeout: datetime.timedelta) -> None:
        self._pool, self.group, self._store = pool, group, store
        self._quorum_id, self._handles, self._timeout = quorum_id, handles, timeout
        self._done = False

    def join(self) -> ReconfiguredGroup:
        """Reconfigure the group for the quorum (every member does, at the same time)."""
        try:
            self.group.reconfigure(self._store, self._quorum_id, self._handles, self._timeout)
        finally:
            self._done = True
            self._pool.give_back(self.group)
        log.info("quorum %d: the cross-replica group (#%d) reconfigured in place, rank %d of %d",
                 self._quorum_id, self.group.number, self.group.rank(), self.group.size())
        return self.group

    def drop(self) -> None:
        """Not joined (a newer quorum came first): the group is free again."""
        if not self._done:
            self._done = True
            self._pool.give_back(self.group)


class ReconfigureTransport:
    """FTAR's quorum groups as one gloo group reconfigured per quorum
    (``prepare``); one-off groups (a catch-up transfer's) built as gloo's."""

    name = "gloo"
    device = torch.device("cpu")
    in_place = True

    def __init__(self, gloo: GlooTransport) -> None:
        self._gloo = gloo
        self.pool = GroupPool(self._backend)
        self._last_uuid = 0

    def _backend(self, store: ForwardingStore, stable_rank: int, timeout: datetime.timedelta) -> object:
        return self._gloo.backend(store, stable_rank, 1, timeout, reconfigure=True)

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
        return self._gloo.build(store, rank, size, timeout)

    def abort(self, group: object) -> None:
        """Nothing: a reconfigured group is kept; its abandoned collectives end at its timeout."""

    def held(self) -> tuple[object, ...]:
        return self.pool.groups

    def prepare(self, store: dist.Store, rank: int, size: int, quorum_id: int, timeout: datetime.timedelta,
                grows: object | None = None) -> Reconfiguring:
        """Write this member's handle for quorum ``quorum_id`` and wait for
        every member's. ``grows``: the group of the quorum this one only
        adds replicas to, reconfigured at the agreed step boundary."""
        if quorum_id <= self._last_uuid:
            raise RuntimeError(f"quorum {quorum_id} is not newer than quorum {self._last_uuid}, "
                               "which this process already met in: a reconfigure uuid must never repeat")
        self._last_uuid = quorum_id
        group = self.pool.take(grows if isinstance(grows, ReconfiguredGroup) else None, timeout)
        try:
            store.set(f"handle/{rank}", group.handle())
            keys = [f"handle/{r}" for r in range(size)]
            store.wait(keys, timeout)
            handles = [h.decode() for h in store.multi_get(keys)]
        except BaseException:
            self.pool.give_back(group)
            raise
        return Reconfiguring(self.pool, group, store, quorum_id, handles, timeout)


__all__ = ["ForwardingStore", "GroupPool", "ReconfigureTransport", "ReconfiguredGroup", "Reconfiguring",
           "supported"]
