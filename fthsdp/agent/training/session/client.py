"""A replica's Session call: registration, heartbeats and pushes on one stream.

The coordinator takes new calls slowly when busy (fthsdp/coordinator/serving/session_stream.py),
so a replica opens one call, not three. ``open_session`` sends the
registration and waits for its answer, trying each coordinator in turn the
way ``CoordinatorClient.call`` does; the returned ``SessionCall`` queues
heartbeats and yields the coordinator's Watch events. When the stream ends,
``ended()`` says why, in the same terms as a unary call would have failed.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Protocol

import grpc

from fthsdp.client import CoordinatorClient
from fthsdp.core.errors import CoordinatorUnavailable, RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb

_MOVE_ON = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class WatchStream(Protocol):
    """A Watch call's stream of events (grpc ships no types)."""

    def __iter__(self) -> Iterator[pb.WatchEvent]: ...

    def cancel(self) -> bool: ...


class SessionCall:
    def __init__(self, call, outbox: queue.SimpleQueue, address: str, registered: pb.RegisterResponse) -> None:
        self.call = call
        self.address = address
        self.registered = registered
        self._outbox = outbox

    @property
    def session_id(self) -> str:
        return self.registered.session_id

    def heartbeat(self, request: pb.HeartbeatRequest) -> None:
        """Queue a heartbeat (sent at once by gRPC's thread)."""
        self._outbox.put(pb.SessionRequest(heartbeat=request))

    def events(self, on_ack: Callable[[pb.HeartbeatResponse], None] | None = None) -> Iterator[pb.WatchEvent]:
        """The coordinator's Watch events, until the stream ends (no error
        raised); its answers to heartbeats go to ``on_ack``."""
        try:
            for event in self.call:
                kind = event.WhichOneof("message")
                if kind == "watch":
                    yield event.watch
                elif kind == "ack" and on_ack is not None:
                    on_ack(event.ack)
        except grpc.RpcError:
            return  # ended(): why

    def ended(self) -> RequestRejected | CoordinatorUnavailable | None:
        """Why the stream ended: unavailable (move on to the next coordinator),
        rejected (a refusal, such as a session replaced by a newer one), or
        None (cancelled here, or closed cleanly)."""
        code = self.call.code()
        if code in (None, grpc.StatusCode.OK) or (code == grpc.StatusCode.CANCELLED and self.call.cancelled()):
            return None
        if code in _MOVE_ON:
            return CoordinatorUnavailable(
                f"{self.address}: session ended: {code.name.lower()} {self.call.details() or ''}"
            )
        return RequestRejected(code, f"{self.address}: {self.call.details()}")

    def close(self) -> None:
        self._outbox.put(None)  # ends the request iterator: a clean half-close
        self.call.cancel()


def open_session(client: CoordinatorClient, register: pb.RegisterRequest) -> SessionCall:
    """Open a Session on the first coordinator that registers this replica
    (a coordinator that stopped answering is found by the channel's
    keepalive, within 15 s)."""
    errors = []
    for _ in range(len(client.addresses)):
        address = client.current_address()
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        outbox.put(pb.SessionRequest(register=register))
        call = client.stub(address).Session(iter(outbox.get, None), metadata=client.metadata)
        try:
            first = next(call)  # the registration's answer, or the error that refused it
        except StopIteration:
            errors.append(f"{address}: session closed before registering")
            client.advance()
            continue
        except grpc.RpcError as e:
            if e.code() in _MOVE_ON:
                errors.append(f"{address}: {e.code().name.lower()}")
                client.advance()
                continue
            raise RequestRejected(e.code(), f"{address}: {e.details()}") from e
        if first.WhichOneof("message") != "registered":
            call.cancel()
            raise RequestRejected(
                grpc.StatusCode.INTERNAL,
                f"{address}: a Session answered {first.WhichOneof('message')} before registering",
            )
        return SessionCall(call, outbox, address, first.registered)
    raise CoordinatorUnavailable(f"no coordinator answered ({'; '.join(errors)})")
