"""The Host call: one agent of a group of several hosts, for as long as it runs.

The first request says hello (fthsdp/coordinator/hosts/table.py ``hello``);
then come joins, failure reports, a leave and heartbeats, each applied to
the job's host table as it arrives. Out go the table's pushes to this host,
in order. The stream closing without a leave counts as the host lost, at
once; a host whose heartbeats stop is lost after the heartbeat timeout.

A hello the table refuses changes nothing and ends the call with one line,
logged once: a host that would form its group wrong is pushed ``refused``;
a host id that another agent's open stream holds (another incarnation) ends
it with PERMISSION_DENIED; a round the group cannot be in (past the
current round, or the next one for a host that ran in it) with
FAILED_PRECONDITION, as does such a join later on the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from fthsdp.coordinator import validation
from fthsdp.coordinator.hosts.rendezvous import JoinRefused
from fthsdp.core.auth import PermissionDenied
from fthsdp.core.errors import FthsdpError, InvalidRequest, OutOfRange
from fthsdp.core.names import MAX_ADDRESS_LEN, MAX_REPLICA_ID_LEN, name_problem
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")

MAX_INCARNATION_LEN = 64


def check_hello_claims(hello: pb.HostHello) -> None:
    """The hello's fields of issue 48 (its incarnation, address and the
    group's hosts by node rank), in form; what they may claim is the host
    table's to judge (fthsdp/coordinator/hosts/claims.py)."""
    if len(hello.incarnation) > MAX_INCARNATION_LEN:
        raise InvalidRequest(f"incarnation is {len(hello.incarnation)} characters long; the limit is "
                             f"{MAX_INCARNATION_LEN}")
    if len(hello.address) > MAX_ADDRESS_LEN:
        raise InvalidRequest(f"address is {len(hello.address)} characters long; the limit is {MAX_ADDRESS_LEN}")
    if hello.hosts and len(hello.hosts) != hello.nnodes:
        raise InvalidRequest(f"hosts names {len(hello.hosts)} hosts; give one per node rank (nnodes {hello.nnodes})")
    if hello.hosts_round < 0 or bool(hello.hosts) != bool(hello.hosts_round):
        raise InvalidRequest(f"hosts_round is the round of hosts: above 0 with hosts, 0 without, got "
                             f"{hello.hosts_round}")
    for host in hello.hosts:
        if host and (problem := name_problem("hosts entry", host, MAX_REPLICA_ID_LEN)):
            raise InvalidRequest(problem)


def check_certificate(host_id: str, names: frozenset[str] | None) -> None:
    """With mutual TLS, a host's client certificate names the host ids it may
    speak for (its common name and DNS subject alternative names: ``names``;
    None without a client certificate): the hello's must be one of them."""
    if names is not None and host_id not in names:
        shown = ", ".join(sorted(names)[:8]) or "no name"
        raise PermissionDenied(f"host {host_id!r}: its client certificate names {shown}; a host's certificate must "
                               f"name the host id it speaks for (--host-id): see docs/coordinator.md#tls")


async def serve(runtime, requests: AsyncIterator, check,
                names: frozenset[str] | None = None) -> AsyncIterator[pb.HostPush | FthsdpError | Exception]:
    """The HostPush messages of one Host stream; an error ends it (the caller
    maps it to a status). ``check(request)`` validates size and form;
    ``names``: what the peer's client certificate names (mutual TLS; None: no certificate)."""
    first = await anext(requests, None)
    if first is None:
        return
    check(first)
    if first.WhichOneof("message") != "hello":
        raise InvalidRequest("a Host stream starts with a hello")
    hello = first.hello
    validation.check_job_field(hello.job, allow_empty=True)
    validation.check_host_hello(hello)
    check_hello_claims(hello)
    try:
        check_certificate(hello.host_id, names)
    except PermissionDenied as e:
        log.warning("job %s: host %s refused: %s", hello.job or "default", hello.host_id, e)
        raise
    job = runtime.job(hello.job)
    table = job.hosts
    out: asyncio.Queue = asyncio.Queue()
    def push(message: pb.HostPush | None) -> None:
        if message is not None and message.WhichOneof("message") == "welcome":
            # The pace of every sender, hosts included; a change is pushed (HostIndex.pace).
            message.welcome.heartbeat_interval = job.pacer.current.interval
            message.welcome.beats_in_batches = True  # PingBatch.hosts: fthsdp/coordinator/serving/servicer.py
        out.put_nowait(message)

    try:
        connection = table.hello(hello, push, runtime.clock())
    except JoinRefused as e:
        log.warning("job %s: host %s refused: %s", table.job, hello.host_id, e)
        yield pb.HostPush(refused=str(e))
        return
    except (PermissionDenied, OutOfRange) as e:
        # Another agent's host id, or a round the group cannot be in: the call ends with the status
        # (PERMISSION_DENIED, FAILED_PRECONDITION), nothing recorded; the agent shows the line and ends.
        log.warning("job %s: host %s refused: %s", table.job, hello.host_id, e)
        raise
    host_id = hello.host_id

    async def read() -> None:
        try:
            async for request in requests:
                check(request)
                validation.check_host_request(request)
                now, which = runtime.clock(), request.WhichOneof("message")
                if which == "join":
                    try:
                        join = request.join
                        table.join(host_id, join.round, join.store, now, join.pings, join.pings_cert)
                    except OutOfRange as e:
                        log.warning("job %s: host %s: join refused: %s", table.job, host_id, e)
                        raise
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
