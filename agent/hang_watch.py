"""The node agent's side of the coordinator's hang verdict.

The coordinator takes a replica out when others waited for it past the hang
limit, or when it went silent while its connections stayed open (a stopped
process): its state is lost either way, and its ranks, still running, would
never end on their own. The agent follows the replica's Watch stream (as an
observer: the stream keeps nothing alive) and, on a notice for the
incarnation it runs now, fails the group: the ranks get SIGTERM (their
stack dumps are already in their logs: agent/hang_notice.py), SIGKILL after
--hang-grace, and the group restarts and catches up like after a crash.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import grpc

from coordinator.credentials import TlsFiles
from protos.fthsdp.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent")


class HangWatch:
    def __init__(self, addresses: Sequence[str], job: str, replica_id: str, token: str = "",
                 tls: TlsFiles | None = None) -> None:
        from coordinator.client import CoordinatorClient  # gRPC only where it is used

        self._client = CoordinatorClient(addresses, token=token, tls=tls)
        self._request = pb.WatchRequest(job=job, replica_id=replica_id)
        self._notice: pb.HangNotice | None = None
        self._stop = threading.Event()
        self._stream = None
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
                    self._notice = event.hang if event.HasField("hang") else None
                    failing = False
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                (log.debug if failing else log.warning)("hang watch: %s %s", e.code().name, e.details())
                failing = True
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._client.advance()
            self._stop.wait(0.5)  # a coordinator that is down is not hammered

    def close(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.cancel()
        self._thread.join(timeout=2)
        self._client.close()
