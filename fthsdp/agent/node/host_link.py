"""The node agent's Host stream to the coordinator (groups of several hosts).

One long-lived call (fthsdp/coordinator/hosts/stream.py): a hello first
(rebuilt at every reconnect from the agent's current round, so that a
coordinator that restarted learns where the group is), then what the agent
sends (joins, failure reports, a leave) and a heartbeat whenever nothing
else went out for the coordinator's heartbeat interval. What the
coordinator pushes lands in ``inbox`` as it comes, for the agent's one
thread to act on. A broken stream is opened again, on the next
coordinator address, backing off to ``RETRY_CAP`` with jitter (``backoff``:
after a leader's failover thousands of hosts reconnect, spread out rather
than in waves); what was queued to send goes out on the new stream, in
order. The coordinator paces the heartbeats: its welcome names the
interval, and a ``heartbeat_interval`` push changes it.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from fthsdp.core.credentials import TlsFiles
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent")

RETRY_FIRST = 0.2
RETRY_CAP = 2.0
DEFAULT_BEAT = 1.0
"""Heartbeat interval until the coordinator's welcome names its own."""
FATAL = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
         grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED)
"""Answers that another try cannot change: the agent is told, as a refusal."""


def backoff(delay: float, draw: Callable[[], float] = random.random) -> float:
    """The wait before the next try: between half of ``delay`` and all of it ("equal jitter")."""
    return delay * (0.5 + 0.5 * draw())


class HostLink:
    def __init__(self, addresses: Sequence[str], token: str, tls: TlsFiles | None,
                 hello: Callable[[], pb.HostHello], inbox: queue.Queue) -> None:
        from fthsdp.client import CoordinatorClient  # gRPC only where it is used

        self._client = CoordinatorClient(addresses, token=token, tls=tls)
        self._hello = hello
        self.inbox = inbox
        self._outbox: queue.Queue[pb.HostRequest | None] = queue.Queue()
        self._beat = DEFAULT_BEAT
        self._stop = threading.Event()
        self._closing = threading.Event()
        self._call: Any = None  # a grpc call: grpc ships no types
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fthsdp-agent-host-link", daemon=True)
        self._thread.start()

    def send(self, request: pb.HostRequest) -> None:
        self._outbox.put(request)

    def _requests(self, generation: threading.Event):
        yield pb.HostRequest(hello=self._hello())
        while not generation.is_set():
            try:
                request = self._outbox.get(timeout=self._beat)
            except queue.Empty:
                yield pb.HostRequest(heartbeat=True)
                continue
            if request is None:  # closing: end the stream from this side
                return
            yield request

    def _run(self) -> None:
        delay, failing = RETRY_FIRST, False
        while not self._stop.is_set():
            generation = threading.Event()
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._call = self._client.stub(self._client.current_address()).Host(
                        self._requests(generation), metadata=self._client.metadata)
                for push in self._call:
                    if push.WhichOneof("message") == "heartbeat_interval":
                        self._beat = push.heartbeat_interval if push.heartbeat_interval > 0 else self._beat
                        continue  # the link's own: nothing for the agent's round to act on
                    if push.WhichOneof("message") == "welcome" and push.welcome.heartbeat_interval > 0:
                        self._beat = push.welcome.heartbeat_interval
                        if failing:
                            log.info("host stream to the coordinator (%s) open again",
                                     self._client.current_address())
                        delay, failing = RETRY_FIRST, False
                    self.inbox.put(push)
                if self._stop.is_set() or self._closing.is_set():
                    return
                log.warning("the coordinator closed the host stream; opening it again")
            except grpc.RpcError as e:
                if self._stop.is_set() or self._closing.is_set():
                    return
                if e.code() in FATAL:
                    self.inbox.put(pb.HostPush(refused=f"{e.code().name}: {e.details()}"))
                    return
                (log.debug if failing else log.warning)("host stream: %s %s; opening it again", e.code().name,
                                                        e.details())
                failing = True
                self._client.advance()
            finally:
                generation.set()
            if self._stop.wait(backoff(delay)):
                return
            delay = min(delay * 2, RETRY_CAP)

    def close(self, leave: pb.HostLeave | None = None, timeout: float = 3.0) -> None:
        """End the stream, after sending ``leave`` if given (so that the
        coordinator counts the host gone for good, not lost)."""
        self._closing.set()
        if leave is not None:
            self._outbox.put(pb.HostRequest(leave=leave))
        self._outbox.put(None)
        self._thread.join(timeout)
        with self._lock:
            self._stop.set()
            if self._call is not None:
                self._call.cancel()
        self._thread.join(2.0)
        self._client.close()
