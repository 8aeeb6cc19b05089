"""Heartbeats on one long-lived HeartbeatStream instead of a call each.

A stream message costs the coordinator about a third of the CPU of a unary
call (benchmarks/README.md), which is what lets one coordinator hold
thousands of replicas. The sender keeps one stream open to the coordinator
the client talks to; a heartbeat is queued on it and sent at once. A stream
that ended is reported at the next ``send`` the way the unary call would
have failed: ``RequestRejected`` for a refusal (the caller registers again),
``CoordinatorUnavailable`` once the client moved on to the next coordinator.
That heartbeat then goes on a fresh stream.

The ranks other than 0 of a replica group send their liveness pings this
way; rank 0 heartbeats on its Session (fthsdp/agent/training/session/client.py).
"""

from __future__ import annotations

import queue

import grpc

from fthsdp.client import CoordinatorClient
from fthsdp.core.errors import CoordinatorUnavailable, RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb

_MOVE_ON = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class HeartbeatSender:
    def __init__(self, client: CoordinatorClient) -> None:
        self.client = client
        self._queue: queue.SimpleQueue | None = None
        self._call = None
        self._address = ""

    def send(self, request: pb.HeartbeatRequest) -> None:
        """Queue ``request`` on the open stream, opening one if needed; raises
        what ended the previous stream, if it ended since the last send."""
        self._check()
        if self._call is None:
            self._open()
        assert self._queue is not None  # _open() made it; close() clears it with the call
        self._queue.put(request)

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)  # ends the request iterator: a clean half-close
        if self._call is not None:
            self._call.cancel()
        self._call = self._queue = None

    def _open(self) -> None:
        self._queue = queue.SimpleQueue()
        self._address = self.client.current_address()
        requests = iter(self._queue.get, None)
        self._call = self.client.stub(self._address).HeartbeatStream(requests, metadata=self.client.metadata)

    def _check(self) -> None:
        call = self._call
        if call is None or not call.done():
            return
        self.close()
        code, details = call.code(), call.details()
        if code in _MOVE_ON:
            self.client.advance()
            raise CoordinatorUnavailable(
                f"{self._address}: heartbeat stream ended: {code.name.lower()} {details or ''}"
            )
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
            raise RequestRejected(code, f"{self._address}: {details}")
