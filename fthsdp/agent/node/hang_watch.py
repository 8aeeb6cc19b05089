"""The node agent's side of the coordinator's hang verdict.

The coordinator takes a replica out when others waited for it past the hang
limit, or when it went silent while its connections stayed open (a stopped
process): its state is lost either way, and its ranks, still running, would
never end on their own. The agent follows the replica's Watch stream (as an
observer: the stream keeps nothing alive) and, on a notice for the
incarnation it runs now, fails the group: the ranks get SIGTERM (their
stack dumps, each rank told of the same verdict on its own stream, land in
their logs within the grace: fthsdp/agent/training/session/hang_notice.py), SIGKILL after
--hang-grace, and the group restarts and catches up like after a crash.

The same stream carries the coordinator's other verdicts on the replica:
that its job finished (``finished_step``: a rank that exits 0 then ends the
agent as SUCCEEDED, "job finished at step N"), and a checksum mismatch
(``divergence_for``): one that says ``give_up`` (taken out twice in a row
after catching up, fthsdp/coordinator/decisions/divergence.py) ends the agent as GAVE_UP
instead of a restart that would repeat it. And the faults an operator
injected (``faults``: fthsdp/agent/injection.py): a ``kill`` is the agent's to carry out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import grpc

from fthsdp.agent.injection import AgentFaults
from fthsdp.core.credentials import TlsFiles
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent")


class _WatchStream(Protocol):
    """A Watch call's stream of events (grpc ships no types)."""

    def __iter__(self) -> Iterator[pb.WatchEvent]: ...

    def cancel(self) -> bool: ...


class HangWatch:
    def __init__(self, addresses: Sequence[str], job: str, replica_id: str, token: str = "",
                 tls: TlsFiles | None = None) -> None:
        from fthsdp.client import CoordinatorClient  # gRPC only where it is used

        self._client = CoordinatorClient(addresses, token=token, tls=tls)
        self._request = pb.WatchRequest(job=job, replica_id=replica_id)
        self._notice: pb.HangNotice | None = None
        self._divergence: pb.Divergence | None = None
        self.finished_step = 0
        """The step at which the job finished, per the coordinator (0: not finished)."""
        self.faults = AgentFaults(replica_id)
        """Injected faults (`fthsdp inject`) the latest event carries."""
        self._placed: bool | None = None
        """Whether the latest event gave the replica a place in the quorum (None: no event yet)."""
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._stream: _WatchStream | None = None
        self._thread = threading.Thread(target=self._run, name="fthsdp-agent-hang-watch", daemon=True)
        self._thread.start()

    def notice_for(self, restart_count: int) -> str | None:
        """Why the coordinator took out the incarnation ``restart_count``, if it did."""
        notice = self._notice
        return notice.reason if notice is not None and notice.restart_count == restart_count else None

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self._stream = self._client.stub(self._client.current_address()).Watch(
                    self._request, metadata=self._client.metadata
                )
                for event in self._stream:
                    with self._cond:
                        self._notice = event.hang if event.HasField("hang") else None
                        self._divergence = event.divergence if event.HasField("divergence") else None
                        self.finished_step = event.finished.step if event.HasField("finished") else 0
                        self._placed = event.HasField("place")
                        self.faults.update(event.injections)
                        self._cond.notify_all()
                    failing = False
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                (log.debug if failing else log.warning)("hang watch: %s %s", e.code().name, e.details())
                failing = True
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._client.advance()
            self._stop.wait(0.5)  # a coordinator that is down is not hammered

    def divergence_for(self, restart_count: int, settle: float = 0.0) -> pb.Divergence | None:
        """The coordinator's checksum-mismatch verdict on incarnation
        ``restart_count``, if it took the replica out for one. ``settle``:
        seconds to wait, at most, for the stream to show the replica out of
        the quorum (a rank that exits because it was taken out may be seen
        a moment before the push that took it out reaches this stream)."""
        end = time.monotonic() + settle
        with self._cond:
            while self._placed and not self._stop.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            d = self._divergence
        return d if d is not None and d.restart_count == restart_count else None

    def close(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.cancel()
        self._thread.join(timeout=2)
        self._client.close()
