"""The Host call: one agent of a group of several hosts, for as long as it runs.

The first request says hello (fthsdp/coordinator/host_table.py ``hello``);
then come joins, failure reports, a leave and heartbeats, each applied to
the job's host table as it arrives. Out go the table's pushes to this host,
in order. The stream closing without a leave counts as the host lost, at
once; a host whose heartbeats stop is lost after the heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from fthsdp.coordinator import validation
from fthsdp.coordinator.rendezvous import JoinRefused
from fthsdp.core.errors import FthsdpError, InvalidRequest
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")


async def serve(runtime, requests: AsyncIterator, check) -> AsyncIterator[pb.HostPush | FthsdpError | Exception]:
    """The HostPush messages of one Host stream; an error ends it (the caller
    maps it to a status). ``check(request)`` validates size and form."""
    first = await anext(requests, None)
    if first is None:
        return
    check(first)
    if first.WhichOneof("message") != "hello":
        raise InvalidRequest("a Host stream starts with a hello")
    hello = first.hello
    validation.check_job_field(hello.job, allow_empty=True)
    validation.check_host_hello(hello)
    job = runtime.job(hello.job)
    table = job.hosts
    out: asyncio.Queue = asyncio.Queue()
    interval = job.pacer.base.interval  # hosts are few beside ranks: the configured pace

    def push(message: pb.HostPush | None) -> None:
        if message is not None and message.WhichOneof("message") == "welcome":
            message.welcome.heartbeat_interval = interval
        out.put_nowait(message)

    try:
        connection = table.hello(hello, push, runtime.clock())
    except JoinRefused as e:
        log.warning("job %s: host %s refused: %s", table.job, hello.host_id, e)
        yield pb.HostPush(refused=str(e))
        return
    host_id = hello.host_id

    async def read() -> None:
        try:
            async for request in requests:
                check(request)
                validation.check_host_request(request)
                now, which = runtime.clock(), request.WhichOneof("message")
                if which == "join":
                    table.join(host_id, request.join.round, request.join.store, now)
                elif which == "failure":
                    table.failure(host_id, request.failure.round, request.failure.reason, now)
                    runtime.wake()  # the replica's quorum learns from the agent's FAILED event as well
                elif which == "leave":
                    table.leave(host_id, request.leave.round, request.leave.reason, now)
                else:
                    table.beat(host_id, now)
            out.put_nowait(None)  # the agent closed its side
        except Exception as e:  # noqa: BLE001 - handed to the sending side
            if not isinstance(e, FthsdpError):
                log.exception("Host stream of %s failed", host_id)
            out.put_nowait(e)

    reader = asyncio.create_task(read())
    try:
        while (item := await out.get()) is not None:
            yield item
            if isinstance(item, Exception):
                return
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        table.closed(host_id, connection, runtime.clock())
