"""Keeping a replica's cross-replica group in step with the coordinator's quorum.

gloo cannot shrink, so every quorum has a group of its own. This module
knows which group the next collective runs in: the current one, or the
newest quorum's (built, or already built in the background for a quorum
that only grows the current one, switched to at the step boundary the
members agreed on; see fthsdp/agent/training/ftar/allreduce.py). And it waits for collectives and
builds together with the coordinator's push: a newer quorum that drops a
member abandons the wait at once (gloo's ``abort()`` would not unblock it);
one that only grows the group is waited out for a patience.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from fthsdp.agent.training.ftar.completion import CompletionWaiter
from fthsdp.agent.training.ftar.decisions import is_growth
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.transport import Collectives, Pending, Transport
from fthsdp.agent.training.transport.gloo import GlooTransport
from fthsdp.core.errors import Evicted, FtarTimeout
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.ftar")

RECHECK_S = 0.02
"""The longest a wait on a collective sleeps between looks at the growth patience and the deadline."""




@dataclasses.dataclass
class QuorumGroup:
    """The process group of one quorum, as this rank is in it."""

    quorum_id: int
    rank: int
    """This replica's rank in the quorum."""
    size: int
    pg: Collectives


class _Prebuild:
    """A quorum's group prepared on a helper thread while training goes on in
    the old one (``Transport.prepare``: the whole group, or the members'
    handles of a group reconfigured in place); ``join`` finishes it."""

    def __init__(self, quorum: pb.Quorum, rank: int, prepare: Callable[[], Pending]) -> None:
        self.quorum_id = quorum.id
        self.rank, self.size = rank, quorum.member_count
        self.pending: Pending | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._discarded = False

        def run() -> None:
            try:
                pending = prepare()
                with self._lock:
                    self.pending = pending
                    if self._discarded:
                        pending.drop()
            except BaseException as e:  # noqa: BLE001 - reported through ready()
                self.error = e
            finally:
                self.done.set()

        threading.Thread(target=run, name=f"fthsdp-ftar-prebuild-q{quorum.id}", daemon=True).start()

    def ready(self) -> bool:
        return self.done.is_set() and self.pending is not None

    def join(self) -> QuorumGroup:
        """The group, joined (every member joins at the same time)."""
        assert self.pending is not None  # ready()
        return QuorumGroup(self.quorum_id, self.rank, self.size, self.pending.join())  # type: ignore[arg-type]

    def discard(self) -> None:
        """Never joined (a newer quorum came first): what it holds is let go, now or when prepared."""
        with self._lock:
            self._discarded = True
            if self.pending is not None:
                self.pending.drop()


DONE, NEWER = "done", "newer"
"""What a wait ends with: the collective (or build) finished, or a newer quorum came."""

PATIENCE_MIN = 2.0
PATIENCE_STEPS = 3
"""How long a collective (or a group's build) waits for a quorum's
members once a quorum that grows it is known: PATIENCE_STEPS of the longest
recent step, at least PATIENCE_MIN seconds. Members normally switch at an
agreed boundary long before; past it they abandon the group for the newest
quorum, which ends the rare case of a member that never saw the old quorum
(its push came too close to the next one's)."""


def _tcp_store_client(address: str, timeout: datetime.timedelta) -> dist.Store:
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host.strip("[]"), int(port), is_master=False, timeout=timeout, wait_for_workers=False)


class QuorumGroups:
    """The group of the quorum this replica trains in, and the waits on it."""

    def __init__(self, view: QuorumView, job: str, shard_rank: int = 0, timeout: float = 60.0,
                 transport: Transport | None = None) -> None:
        """``transport``: what the groups are built with (gloo by default:
        fthsdp/agent/training/transport/)."""
        self.view = view
        self.job = job
        self.shard_rank = shard_rank
        self.timeout = timeout
        self.transport: Transport = transport if transport is not None else GlooTransport()
        self._waiter = CompletionWaiter(view.cond) if self.transport.device.type == "cpu" else None
        """Wakes ``wait_work`` when a CPU collective completes (fthsdp/agent/training/ftar/completion.py)."""
        self._group: QuorumGroup | None = None
        self._in_step_with = 0
        """The group whose members are known to be at the same step."""
        # Abandoned groups are kept alive: destroying one whose collective is
        # still blocked could block the destructor on this thread.
        self._abandoned: list[tuple[float, QuorumGroup]] = []
        self._prebuilt: dict[int, _Prebuild] = {}
        """Groups of growth quorums, built in the background (by quorum id)."""
        self._switch_to = 0
        """The growth quorum every member agreed to switch to at this step."""
        self._called: float | None = None
        self._intervals: list[float] = []
        self.connect_store: Callable[[str, datetime.timedelta], dist.Store] = _tcp_store_client
        """How a group's build reaches the rendezvous store of a quorum, at its
        first member's "host:port" (a TCP client; tests/test_commit_vote.py
        gives an in-process store)."""
        self.horizon: Callable[[], float] = lambda: 0.0
        """How long the coordinator may take to blame a hung member (from its
        push): no collective gives up before it, whatever ``timeout`` says,
        so that the members waiting for a hung peer are never the ones that leave."""

    def _deadline(self, deadline: float) -> float:
        """``deadline`` (an operation's start plus ``timeout``) stretched to the horizon."""
        return deadline - self.timeout + max(self.timeout, self.horizon())

    def note_step(self, now: float) -> None:
        """One step began now: the recent step times set the patience."""
        if self._called is not None:
            self._intervals = (self._intervals + [now - self._called])[-8:]
        self._called = now

    @property
    def group(self) -> QuorumGroup | None:
        """The group this replica trains in now (None before the first, or after a failure)."""
        return self._group

    def in_step(self, group: QuorumGroup) -> bool:
        """Whether ``group``'s members are known to be at the same step (no agree needed)."""
        return group.quorum_id == self._in_step_with

    def mark_in_step(self, group: QuorumGroup | None) -> None:
        """After an agree: the members of ``group`` are at one step (None: not known, agree again)."""
        self._in_step_with = group.quorum_id if group is not None else 0

    def next_group(self) -> QuorumGroup | None:
        """The group the next step's data all-reduce will run in, where that
        is known now and needs no agree: the current group while it is in
        step, with no switch agreed and no newer quorum but one that only
        grows it (that one waits for the agreed switch); else None. The
        members of a group in step all see the same, except for a newer
        quorum that comes meanwhile, which takes them out of the group anyway."""
        group, quorum = self._group, self.view.quorum
        if group is None or self._in_step_with != group.quorum_id or self._switch_to:
            return None
        if quorum is None or (quorum.id != group.quorum_id and not is_growth(group.quorum_id, quorum)):
            return None
        return group

    def agree_switch(self, quorum_id: int) -> None:
        """Every member agreed to switch to growth quorum ``quorum_id`` at this step (0: none)."""
        self._switch_to = quorum_id

    def growth_ready(self) -> int:
        """The id of the newest quorum if it only adds replicas to the group
        this one trains in and its group is built here, else 0: the switch
        this rank proposes. Starts building that group if nobody has."""
        group, quorum = self._group, self.view.quorum
        if group is None or quorum is None or quorum.id == group.quorum_id:
            return 0  # every step but a membership change's
        if self._in_step_with != group.quorum_id or not is_growth(group.quorum_id, quorum):
            return 0
        return quorum.id if self._prebuild(quorum).ready() else 0

    def _prebuild(self, quorum: pb.Quorum) -> _Prebuild:
        pre = self._prebuilt.get(quorum.id)
        if pre is None:
            rank = self.view.rank_in(quorum)
            if rank is None:
                raise Evicted(f"quorum {quorum.id} does not include this replica{self.view.out_because()}")
            group = self._group
            grows = group.pg if group is not None and is_growth(group.quorum_id, quorum) else None
            pre = self._prebuilt[quorum.id] = _Prebuild(quorum, rank, lambda: self._prepare(quorum, rank, grows))
        return pre

    # ----- groups --------------------------------------------------------------------

    def current_group(self, deadline: float) -> QuorumGroup:
        """The group to run the next collective in: the current one while a
        quorum that only grows it waits for the agreed switch, else the
        newest quorum's (built if needed; the old one is abandoned)."""
        while True:
            with self.view.cond:
                quorum = self.view.quorum
            if quorum is None or not self.view.includes_me(quorum):
                raise Evicted(f"the newest quorum ({quorum.id if quorum else 'none'}) does not include this replica"
                              f"{self.view.out_because()}")
            group, switch_to, self._switch_to = self._group, self._switch_to, 0
            if group is not None and group.quorum_id == quorum.id:
                return group
            if group is not None and is_growth(group.quorum_id, quorum):
                target = self._prebuilt.get(switch_to)
                if target is None or not target.ready():
                    self._prebuild(quorum)
                    return group  # go on here until every member agrees to switch
                switched = self._join(target, deadline)
                if switched is not None:
                    self._adopt(switched)
                    log.info("quorum %d: switched from quorum %d at a step boundary", target.quorum_id,
                             group.quorum_id)
                    return switched
                # A newer quorum came while the members met. A group reconfigured in
                # place may be mid-reconfigure on the helper thread: never train in it again.
                self.retire(group)
                continue
            if group is not None:
                self.retire(group)
            pre = self._prebuild(quorum)  # one build per quorum, whoever started it
            if self._wait(pre.done.wait, quorum.id, deadline) == DONE:
                if pre.error is not None:
                    self._prebuilt.pop(quorum.id, None)
                    self._await_newer(quorum.id, deadline, pre.error)
                    continue
                built = self._join(pre, deadline)
                if built is None:
                    continue
                self._adopt(built)
                log.info("quorum %d: group of %d built", quorum.id, built.size)
                return built

    def _join(self, pre: _Prebuild, deadline: float) -> QuorumGroup | None:
        """``pre``'s group, joined on a helper thread (a reconfigure is a
        rendezvous of every member); None if a newer quorum came first."""
        joined: list[QuorumGroup] = []
        if self._wait(lambda: joined.append(pre.join()), pre.quorum_id, deadline) == DONE:
            return joined[0]
        self._prebuilt.pop(pre.quorum_id, None)
        return None

    def _adopt(self, group: QuorumGroup) -> None:
        if self._group is not None and self._group is not group:
            self.retire(self._group)
        self._group = group
        self._in_step_with = 0  # the first collective in a new group is an agree
        for q, p in self._prebuilt.items():
            if q < group.quorum_id:
                p.discard()
        self._prebuilt = {q: p for q, p in self._prebuilt.items() if q > group.quorum_id}

    def retire(self, group: QuorumGroup) -> None:
        self.transport.abort(group.pg)
        now = time.monotonic()
        # Past twice the timeout their collectives have ended: let them go.
        self._abandoned = [(t, g) for t, g in self._abandoned if now - t < 2 * self.timeout]
        self._abandoned.append((now, group))
        if self._group is group:
            self._group = None
        self._in_step_with = 0

    def release(self, *keep: object) -> None:
        """Leave every group to the process's exit (``Manager.close``).

        A group whose collective was abandoned with a hung peer cannot be
        destroyed before that collective times out: gloo's destructor waits
        for it, so a script that simply returned would hang in the
        interpreter's exit for up to the group timeout (``abort()`` does not
        help: docs/measurements.md). Each group is given one reference
        that is never dropped, so Python never destroys it, and the OS
        reclaims its sockets and threads when the process ends.

        ``keep``: more objects to keep so, such as the rendezvous store this
        process hosts. A build abandoned for a newer quorum may still wait on
        it: destroyed at the interpreter's exit, it would fail that wait in a
        thread Python no longer runs, which aborts the process."""
        if self._waiter is not None:
            self._waiter.close()  # not inside gloo's wait when the interpreter exits (completion.py)
        groups = [self._group] + [g for _, g in self._abandoned]
        pending = [p.pending for p in self._prebuilt.values() if p.ready()]
        for kept in ([g.pg for g in groups if g is not None] + [p for p in pending if p is not None]
                     + list(self.transport.held()) + [k for k in keep if k is not None]):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))
        self._group, self._abandoned, self._prebuilt = None, [], {}

    def _prepare(self, quorum: pb.Quorum, rank: int, grows: Collectives | None) -> Pending:
        timeout = datetime.timedelta(seconds=self.timeout)
        store = self.connect_store(quorum.first_member_address, timeout)
        prefix = dist.PrefixStore(f"fthsdp/{self.job}/q{quorum.id}/s{self.shard_rank}", store)
        return self.transport.prepare(prefix, rank, quorum.member_count, quorum.id, timeout, grows)

    # ----- waiting -------------------------------------------------------------------

    def _patience(self) -> float:
        longest = max(self._intervals, default=0.0)
        return min(self.timeout / 2, max(PATIENCE_MIN, PATIENCE_STEPS * longest))

    def _leave_for(self, quorum_id: int, since: list[float]) -> bool:
        """Whether a collective in the group of ``quorum_id`` is left
        for the newest quorum: at once for one that drops a member; for one
        that only grows the group, after the patience (``since`` holds when
        it was first seen, and its id)."""
        newest = self.view.quorum
        if newest is None or newest.id <= quorum_id:
            return False
        if not since or since[1] != newest.id:
            if not is_growth(quorum_id, newest):
                return True
            self._prebuild(newest)
            since[:] = [since[0] if since else time.monotonic(), newest.id]
        if time.monotonic() - since[0] > self._patience():
            log.warning("quorum %d: no agreed switch to quorum %d in %.1fs; leaving for it",
                        quorum_id, newest.id, self._patience())
            return True
        return False

    def wait_work(self, work, group: QuorumGroup, deadline: float, idle: Callable[[], None] | None = None) -> str:
        """Wait for a collective, woken by its completion or by a push (a CPU
        collective: fthsdp/agent/training/ftar/completion.py), else polled with a
        growing sleep (20 us to 1 ms). A newer quorum abandons it, except one
        that only grows the group: the members switch at an agreed step
        boundary instead (see ``_leave_for``). ``idle`` runs between polls
        instead of a wait (a joiner's ``Joining.while_waiting``)."""
        pause = 20e-6
        since: list[float] = []
        watch = None
        if idle is None and self._waiter is not None and not work.is_completed():
            watch = self._waiter.watch(work)
        while not work.is_completed():
            if self._leave_for(group.quorum_id, since):
                return NEWER
            if time.monotonic() > deadline and time.monotonic() > self._deadline(deadline):
                raise FtarTimeout(
                    f"a collective in quorum {group.quorum_id} did not finish and no newer quorum came in "
                    f"{max(self.timeout, self.horizon()):.0f}s, and the coordinator blamed no member for it"
                )
            if idle is not None:
                idle()
                continue
            if watch is not None and not watch.returned:
                assert self._waiter is not None
                self._waiter.wait(watch, RECHECK_S)  # a push, the completion, or a look at the clocks
                continue
            time.sleep(pause)  # no waiter, or its wait() returned before is_completed() said so
            pause = min(pause * 2, 1e-3)
        try:
            work.wait()
        except RuntimeError as e:
            # The collective failed (a peer's connection dropped): the
            # coordinator will push the quorum without that peer.
            return self._await_newer(group.quorum_id, deadline, e)
        return DONE

    def wait_for_push(self, quorum_id: int, deadline: float) -> bool:
        """Wait for the push of quorum ``quorum_id`` (or a newer one), up to an
        operation's ``deadline`` (stretched to the horizon); False if it did not come."""
        with self.view.cond:
            while self.view.newest_id() < quorum_id:
                left = self._deadline(deadline) - time.monotonic()
                if left <= 0:
                    return False
                self.view.cond.wait(left)
        return True

    def _await_newer(self, quorum_id: int, deadline: float, cause: BaseException) -> str:
        log.warning("collective in quorum %d failed (%s); waiting for a newer quorum", quorum_id, cause)
        with self.view.cond:
            while self.view.newest_id() <= quorum_id:
                left = self._deadline(deadline) - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(f"a collective in quorum {quorum_id} failed ({cause}) and no newer quorum came")
                self.view.cond.wait(left)
        return NEWER

    def _wait(self, blocking: Callable[[], object], quorum_id: int, deadline: float) -> str:
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
                with self.view.cond:
                    self.view.cond.notify_all()

        threading.Thread(target=run, name="fthsdp-ftar-build", daemon=True).start()
        since: list[float] = []
        with self.view.cond:
            while not done.is_set():
                if self._leave_for(quorum_id, since):
                    return NEWER
                left = self._deadline(deadline) - time.monotonic()
                if left <= 0:
                    raise FtarTimeout(
                        f"building the group of quorum {quorum_id} did not finish and no newer quorum came"
                    )
                self.view.cond.wait(min(left, 0.1) if since else left)
        if errors:
            return self._await_newer(quorum_id, deadline, errors[0])
        return DONE
