"""Fault injection for operators testing their own cluster (`fthsdp inject`).

An operator asks the coordinator (``Inject``, an admin call: fthsdp/core/auth.py)
to inject ``kill``, ``hang`` or ``slow`` into a running replica. The
coordinator records it here, logs one line (``replica r1: fault injected:
hang (asked by alice@host ...)``), keeps the latest for status and the status
page, and pushes it on the replica's Watch streams (WatchEvent.injections).
Each injection names the incarnation it is for (the replica's
restart_count when it was injected) and carries an id; the executors carry
out an id once, and only in that incarnation, so a restarted replica never
repeats a fault meant for its predecessor. The coordinator stops pushing it
once a new incarnation registers.

Who carries out what (fthsdp/agent/injection.py), and why:

* ``kill``: the node agent, which owns the ranks' processes; it SIGKILLs
  them and then sees what it sees of any crash (a rank exiting on SIGKILL),
  reports FAILED and restarts the group. The coordinator learns of it as of
  any crash (the session stream closing, the agent's report): nothing on
  the recovery path knows that the crash was injected.
* ``hang`` and ``slow``: the rank's library (``Manager``), because only the
  training thread can stop making progress while the process and its
  heartbeat thread live on, which is what a real hang is (a SIGSTOP from the
  agent would stop the heartbeats too: the silence path, not the hang path).
  A hang blocks the training thread at its next step on an event that never
  fires in this incarnation; the coordinator's hang verdict
  (fthsdp/coordinator/decisions/hang.py) takes it out, its stacks are dumped and its agent
  restarts it. A slow fault adds ``seconds`` to each of the next ``steps``
  steps before the all-reduce, i.e. to its compute time: the straggler
  score sees it, and the straggler policy, when on, takes it out.

Kept in memory only: a coordinator restart forgets the record, and a
pending injection that was not yet carried out is not pushed again.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from fthsdp.core.errors import FthsdpError, NotFound
from fthsdp.core.faults import FAULT_NAMES, asked_by, describe
from fthsdp.protos.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from fthsdp.coordinator.job.state import JobState

log = logging.getLogger("fthsdp.coordinator")

RECENT = 50
"""Injections kept per job for status and the status page."""
MAX_PER_INCARNATION = 8
"""Injections pushed at most to one incarnation (each watch event carries them all)."""


class NotInjectable(FthsdpError):
    """The replica has no running incarnation to inject into, or has had
    enough injected already (gRPC FAILED_PRECONDITION): nothing is recorded."""



class InjectionBook:
    """One job's injections: the recent ones (status) and the ones each
    replica's current incarnation is still told about (its watchers)."""

    def __init__(self) -> None:
        self.recent: deque[pb.FaultInjection] = deque(maxlen=RECENT)
        self._pending: dict[str, list[pb.FaultInjection]] = {}
        self._last_id = 0

    def inject(self, state: JobState, request: pb.InjectRequest, peer: str, unix_ms: int) -> pb.FaultInjection:
        """Record an injection into ``request.replica_id``'s running
        incarnation; raises NotFound or NotInjectable (nothing recorded)."""
        rid = request.replica_id
        entry = state.replicas.get(rid)
        if entry is None:
            raise NotFound(f"job {state.name!r} has no replica {rid!r}")
        if entry.incarnation.session_id is None:
            raise NotInjectable(f"replica {rid} has no running incarnation (it failed or left; its agent may be "
                                "restarting it): nothing to inject into; try again once `fthsdp status` shows it back")
        pending = self.for_incarnation(rid, entry.incarnation.restart_count)
        if len(pending) >= MAX_PER_INCARNATION:
            raise NotInjectable(f"replica {rid}'s current incarnation has had {len(pending)} faults injected "
                                f"already (at most {MAX_PER_INCARNATION}); inject more once it restarted")
        # Ids grow across coordinator restarts too (milliseconds of the wall
        # clock), so an executor never takes a new injection for one it did.
        self._last_id = max(self._last_id + 1, unix_ms)
        injection = pb.FaultInjection(
            id=self._last_id, replica_id=rid, kind=request.kind, restart_count=entry.incarnation.restart_count,
            requested_by=request.requested_by, peer=peer, unix_ms=unix_ms, step=entry.incarnation.step,
        )
        if request.kind == pb.FAULT_KIND_SLOW:
            injection.seconds, injection.steps = request.seconds, request.steps
        pending.append(injection)
        self._pending[rid] = pending
        self.recent.append(injection)
        log.warning("job %s: replica %s: fault injected: %s (asked by %s)", state.name, rid, describe(injection),
                    asked_by(injection),
                    extra={"event": "fault_injected", "job": state.name, "replica": rid,
                           "fault": FAULT_NAMES[injection.kind], "injection_id": injection.id,
                           "restart_count": injection.restart_count, "step": injection.step,
                           "seconds": injection.seconds, "steps": injection.steps,
                           "requested_by": injection.requested_by, "peer": peer})
        return injection

    def for_incarnation(self, replica_id: str, restart_count: int) -> list[pb.FaultInjection]:
        """The injections for incarnation ``restart_count``; those for any
        other (a predecessor) are forgotten."""
        pending = [i for i in self._pending.get(replica_id, ()) if i.restart_count == restart_count]
        if pending:
            self._pending[replica_id] = pending
        else:
            self._pending.pop(replica_id, None)
        return pending

    def add_to(self, event: pb.WatchEvent, state: JobState, replica_id: str) -> None:
        """Add what ``replica_id``'s current incarnation must carry out to its watch event."""
        if not replica_id or replica_id not in self._pending:
            return
        entry = state.replicas.get(replica_id)
        if entry is None:
            self._pending.pop(replica_id, None)
            return
        event.injections.extend(self.for_incarnation(replica_id, entry.incarnation.restart_count))
