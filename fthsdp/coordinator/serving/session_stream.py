"""The Session call: Register, HeartbeatStream and Watch on one stream.

A replica that opens three calls costs the coordinator three intakes, and
the asyncio gRPC server takes a new call only every few turns of its event
loop (measured: about five turns a call, so a loop busy with heartbeats
accepts tens of calls a second). Ten thousand replicas starting together
then wait minutes, and a replica registered but whose heartbeat stream is
still queued looks silent. On one call, registering, heartbeating and
being pushed to begin together, and a third of the calls are left.

The first request must register; the rest are heartbeats, recorded as they
arrive (apart from sending, as ``HeartbeatStream`` does). Out go the
registration, then the Watch stream's events and the answers to heartbeats
that asked, serialized once and wrapped here without re-encoding.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from fthsdp.coordinator import validation
from fthsdp.core.errors import FthsdpError, InvalidRequest
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")

_REGISTERED, _WATCH, _ACK = 1, 2, 3
"""SessionEvent's field numbers."""


def wrap(field: int, payload: bytes) -> bytes:
    """``payload`` (a serialized message) as field ``field`` of a SessionEvent."""
    head = bytearray([field << 3 | 2])  # wire type 2: length-delimited
    n = len(payload)
    while n >= 0x80:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + payload


def _heartbeat(request, reg: pb.RegisterRequest, session: str) -> pb.HeartbeatRequest:
    """The heartbeat a Session request carries, completed with the session's names."""
    if isinstance(request, pb.SessionRequest) and request.WhichOneof("message") == "heartbeat":
        beat = request.heartbeat
    else:
        raise InvalidRequest("after the first request (register), a Session carries heartbeats only")
    if beat.replica_id and beat.replica_id != reg.replica_id:
        raise InvalidRequest(f"this Session is replica {reg.replica_id!r}'s, not {beat.replica_id!r}'s")
    if beat.job and beat.job != reg.job:
        raise InvalidRequest(f"this Session is in job {reg.job!r}, not {beat.job!r}")
    beat.job, beat.replica_id = reg.job, reg.replica_id
    beat.session_id = beat.session_id or session
    return beat


async def serve(runtime, requests: AsyncIterator, check) -> AsyncIterator[bytes | FthsdpError | Exception]:
    """The serialized SessionEvents of one Session; an error ends it (the
    caller maps it to a status). ``check(request)`` validates size and form."""
    first = await anext(requests, None)
    if first is None:
        return
    check(first)
    if first.WhichOneof("message") != "register":
        raise InvalidRequest("a Session starts with a register request")
    reg = first.register
    validation.check_job_field(reg.job, allow_empty=True)
    validation.check_register(reg)
    registered = await runtime.register(reg)
    yield wrap(_REGISTERED, registered.SerializeToString())
    watch = runtime.watch(pb.WatchRequest(job=reg.job, replica_id=reg.replica_id, session_id=registered.session_id))
    out: asyncio.Queue = asyncio.Queue()

    async def beats() -> None:
        try:
            async for request in requests:
                check(request)
                beat = _heartbeat(request, reg, registered.session_id)
                validation.check_heartbeat(beat)
                response = runtime.heartbeat(beat)
                if beat.ack:
                    out.put_nowait(wrap(_ACK, response.SerializeToString()))
            out.put_nowait(None)  # the replica closed its side: the session ends
        except Exception as e:  # noqa: BLE001 - handed to the sending side
            if not isinstance(e, FthsdpError):
                log.exception("Session heartbeats failed")
            out.put_nowait(e)

    async def events() -> None:
        try:
            async for event in watch:
                out.put_nowait(wrap(_WATCH, event))
        except Exception as e:  # noqa: BLE001 - handed to the sending side
            if not isinstance(e, FthsdpError):
                log.exception("Session events failed")
            out.put_nowait(e)

    tasks = [asyncio.create_task(beats()), asyncio.create_task(events())]
    try:
        while (item := await out.get()) is not None:
            yield item
            if isinstance(item, Exception):
                return
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watch.aclose()  # the stream closing counts as the replica's, as Watch's does
