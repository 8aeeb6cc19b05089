"""The coordinator's pushes to one rank: delivered into its view, then to its listeners.

Both roles of a rank in its job receive pushes (the replica's session on
rank 0: fthsdp/agent/training/session/membership.py; another rank's Watch stream:
fthsdp/agent/training/session/observer.py). Each push is delivered on the thread
that reads it: first to the listeners that must act before any other thread
sees it (a drain must be known before the quorum that no longer includes
this replica), then into the ``QuorumView`` every other thread reads, then to
the other listeners.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.session.client import WatchStream
from fthsdp.client import CoordinatorClient
from fthsdp.core import quorum_delta
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.membership")

Listener = Callable[[pb.WatchEvent], None]


class Pushes:
    def __init__(self, view: QuorumView) -> None:
        self.view = view
        self._first: list[Listener] = []
        self._listeners: list[Listener] = []

    def add_listener(self, listener: Listener, before_view: bool = False) -> None:
        """Call ``listener(event)`` on the thread that reads the pushes, for
        every push (keep it quick); after the view has it, or ``before_view``."""
        (self._first if before_view else self._listeners).append(listener)

    def deliver(self, event: pb.WatchEvent) -> None:
        for listener in self._first:
            listener(event)
        self.view.update(event)
        for listener in self._listeners:
            listener(event)


class WatchFollower:
    """A Watch stream, reopened until ``stop`` is set: another rank's view of its
    replica's place, or a tool's that shows the member list."""

    def __init__(self, client: CoordinatorClient, request: pb.WatchRequest, deliver: Listener,
                 stop: threading.Event) -> None:
        self._client, self._request, self._deliver, self._stop = client, request, deliver, stop
        self._stream: WatchStream | None = None

    def run(self) -> None:
        while not self._stop.is_set():
            address = self._client.current_address()
            held = None  # the full quorum this stream last described
            try:
                self._stream = self._client.stub(address).Watch(self._request, metadata=self._client.metadata)
                for event in self._stream:
                    held = quorum_delta.resolve(held, event)
                    if event.HasField("delta"):
                        event.quorum.CopyFrom(held)
                        event.ClearField("delta")
                    self._deliver(event)
            except quorum_delta.StaleDelta as e:
                log.warning("watch: %s; reopening the stream", e)
                self.cancel()
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                code = e.code()
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._client.advance()
                elif code != grpc.StatusCode.CANCELLED:
                    log.warning("watch stream ended: %s %s", code.name, e.details())
            # Back off a little so a coordinator that is down is not hammered.
            self._stop.wait(0.1)

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.cancel()


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


__all__ = ["Listener", "Pushes", "WatchFollower", "start_thread"]
