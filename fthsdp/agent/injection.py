"""Carrying out the faults an operator injects (`fthsdp inject`; fthsdp/coordinator/job/injection.py).

The coordinator pushes each injection on the replica's Watch streams, which
both its node agents and its ranks follow. Each executor carries out an
injection once (by id), and only in the incarnation it names
(``restart_count``), so that a restarted replica never repeats its
predecessor's fault. Who does what, and why:

* ``kill`` (``AgentFaults``, in the node agent): the agent owns the ranks'
  processes. It SIGKILLs them and lets supervision see what it sees of any
  crash: a rank exiting on SIGKILL, FAILED, a restart. The coordinator sees
  a crash too (the session stream closes, the agent reports it), so the
  test exercises the real recovery path, not a special one.
* ``hang`` and ``slow`` (``RankFaults``, a Manager listener in every rank):
  only the training thread can stop progressing while the process and its
  heartbeat thread go on, which is what a real hang looks like to the
  coordinator (a SIGSTOP from the agent would silence the heartbeats: the
  silence path, fthsdp/coordinator/job/silence.py, not the hang path). The training
  thread calls ``at_step`` as it enters the step's all-reduce; a hang blocks
  it there for good, in the compute phase, where the members waiting in the
  all-reduce blame it (fthsdp/coordinator/decisions/hang.py); its stacks are dumped
  (fthsdp/agent/training/session/hang_notice.py) and its agent ends and restarts it. A slow fault
  adds its seconds there to each of its next steps: compute time, which the
  straggler score and policy see.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence

from fthsdp.core.faults import asked_by, describe
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent")


def _fresh(injections: Iterable[pb.FaultInjection], restart_count: int, done: set[int]) -> list[pb.FaultInjection]:
    """The injections for incarnation ``restart_count`` not carried out yet (marked done now)."""
    fresh = [i for i in injections if i.restart_count == restart_count and i.id not in done]
    done.update(i.id for i in fresh)
    return fresh


class AgentFaults:
    """The node agent's side: ``kill``; a hang or a slow fault is only logged (its ranks carry it out)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self._latest: tuple[pb.FaultInjection, ...] = ()
        self._done: set[int] = set()
        self._lock = threading.Lock()

    def update(self, injections: Iterable[pb.FaultInjection]) -> None:
        """What the latest watch event carries (the agent's watch thread)."""
        with self._lock:
            self._latest = tuple(injections)

    def kill_due(self, restart_count: int) -> pb.FaultInjection | None:
        """A kill injected into incarnation ``restart_count`` and not carried out yet."""
        with self._lock:
            fresh = _fresh(self._latest, restart_count, self._done)
        kill = None
        for injection in fresh:
            if injection.kind == pb.FAULT_KIND_KILL:
                kill = kill or injection
            else:
                log.warning("replica %s: fault injected: %s (asked by %s); its ranks carry it out",
                            self.replica_id, describe(injection), asked_by(injection))
        return kill


def kill_ranks(ranks: Sequence, injection: pb.FaultInjection, replica_id: str) -> None:
    """SIGKILL every rank's process group, as a crash would end them; the
    supervisor then sees them exit as it sees any crash."""
    log.warning("replica %s: fault injected: kill (asked by %s); SIGKILLing its ranks (pids %s)", replica_id,
                asked_by(injection), " ".join(str(r.pid) for r in ranks),
                extra={"event": "fault_injected", "replica": replica_id, "fault": "kill",
                       "injection_id": injection.id})
    for rank in ranks:
        rank.signal_group(signal.SIGKILL)


class RankFaults:
    """A Manager listener (the watch thread) plus ``at_step`` (the training
    thread): ``hang`` and ``slow`` in this rank's incarnation."""

    def __init__(self, replica_id: str, shard_rank: int, restart_count: int) -> None:
        self.replica_id = replica_id
        self.shard_rank = shard_rank
        self.restart_count = restart_count
        self._done: set[int] = set()
        self._hang: pb.FaultInjection | None = None
        self._slow: pb.FaultInjection | None = None
        self._slow_left = 0
        self.slowed = 0
        """Steps slowed so far (for tests)."""
        self._lock = threading.Lock()
        self._never = threading.Event()
        """What a hung training thread waits for: nothing sets it in this incarnation."""

    def __call__(self, event: pb.WatchEvent) -> None:
        with self._lock:
            for injection in _fresh(event.injections, self.restart_count, self._done):
                if injection.kind == pb.FAULT_KIND_HANG:
                    self._hang = injection
                elif injection.kind == pb.FAULT_KIND_SLOW:  # a newer slow fault replaces an older one
                    self._slow, self._slow_left = injection, injection.steps
                else:
                    continue  # kill: the node agent's
                log.warning("replica %s rank %d: fault injected: %s (asked by %s); from the next step",
                            self.replica_id, self.shard_rank, describe(injection), asked_by(injection))

    def at_step(self, step: int) -> None:
        """The training thread, entering the all-reduce of ``step``."""
        with self._lock:
            hang = self._hang
            slow = self._slow if self._slow_left > 0 else None
            if slow is not None:
                self._slow_left -= 1
                self.slowed += 1
        if hang is not None:
            print(f"fthsdp: replica {self.replica_id} rank {self.shard_rank}: fault injected (hang, asked by "
                  f"{asked_by(hang)}): the training thread blocks at step {step}, heartbeats go on",
                  file=sys.stderr, flush=True)
            self._never.wait()  # the hang itself: the coordinator takes it out, the agent ends it
        if slow is not None:
            time.sleep(slow.seconds)  # the injected slowness itself, in the step's compute time
