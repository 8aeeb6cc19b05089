"""The gRPC edge: validate, call the runtime, map typed errors to status codes.

No membership logic lives here; every method is a few lines over
``CoordinatorRuntime``.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc
from google.protobuf.message import DecodeError

from fthsdp.coordinator import validation
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.hosts import stream as host_stream
from fthsdp.coordinator.job.injection import NotInjectable
from fthsdp.coordinator.serving import session_stream
from fthsdp.core.auth import PermissionDenied, Unauthenticated
from fthsdp.core.errors import (
    FthsdpError,
    InvalidRequest,
    JobNotFinished,
    LostOwnership,
    NotFound,
    NotLeader,
    OutOfRange,
    StaleSession,
    StateNotLost,
    StoreUnavailable,
)
from fthsdp.core.rank_digest import RANK_DIGESTS
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("fthsdp.coordinator")

STATUS_OF = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (StaleSession, grpc.StatusCode.FAILED_PRECONDITION),
    (StateNotLost, grpc.StatusCode.FAILED_PRECONDITION),
    (OutOfRange, grpc.StatusCode.FAILED_PRECONDITION),
    (JobNotFinished, grpc.StatusCode.FAILED_PRECONDITION),
    (NotInjectable, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (LostOwnership, grpc.StatusCode.ABORTED),
    (NotLeader, grpc.StatusCode.UNAVAILABLE),  # clients move on to the next coordinator
)


def certificate_names(context) -> frozenset[str] | None:
    """The names in the peer's client certificate (its common name and
    subject alternative names), or None when it presented none (no mutual TLS)."""
    auth = context.auth_context() or {}
    if not auth.get("x509_pem_cert") and not auth.get("x509_common_name"):
        return None
    values = [*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())]
    return frozenset(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in values)


def status_code_for(error: FthsdpError) -> grpc.StatusCode:
    for kind, code in STATUS_OF:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


class Malformed:
    """Stands in for a request whose bytes did not parse, so that the servicer
    answers INVALID_ARGUMENT instead of gRPC's generic UNKNOWN."""

    def __init__(self, method: str, error: Exception) -> None:
        self.message = f"request is not a valid {method} message: {error}"


def _check_request(request, limit: int) -> None:
    if isinstance(request, Malformed):
        raise InvalidRequest(request.message)
    validation.check_size(request, limit)


def _lenient(deserialize, method: str):
    def parse(data: bytes):
        try:
            return deserialize(data)
        except DecodeError as e:
            return Malformed(method, e)

    return parse


def _bytes_or(serialize):
    """Pass bytes through (Watch serializes its events itself, sharing the
    member list's bytes among watchers); serialize messages as usual."""

    def serializer(message) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return serializer


class _HandlerCapture:
    """Collects what the generated ``add_CoordinatorServicer_to_server`` registers."""

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.service, self.handlers = service, handlers


def add_to_server(servicer: CoordinatorServicer, server) -> None:
    """Register the servicer like the generated helper, with lenient parsing."""
    capture = _HandlerCapture()
    pb_grpc.add_CoordinatorServicer_to_server(servicer, capture)
    handlers = {
        name: handler._replace(
            request_deserializer=_lenient(handler.request_deserializer, name),
            response_serializer=_bytes_or(handler.response_serializer),
        )
        for name, handler in capture.handlers.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service, handlers),))
    server.add_registered_method_handlers(capture.service, handlers)


def _edge(method):
    """Turn typed errors into gRPC statuses and anything else into INTERNAL."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            _check_request(request, self.max_request_bytes)
            return await method(self, request, context)
        except FthsdpError as e:
            await context.abort(status_code_for(e), str(e))
        except Exception:
            log.exception("%s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the coordinator's log")

    return wrapper


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    def __init__(self, runtime: CoordinatorRuntime, max_request_bytes: int) -> None:
        self.runtime = runtime
        self.max_request_bytes = max_request_bytes

    @_edge
    async def Register(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_register(request)
        return await self.runtime.register(request)

    @_edge
    async def Heartbeat(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_heartbeat(request)
        return self.runtime.heartbeat(request)

    async def HeartbeatStream(self, request_iterator, context):
        # Each message as the unary Heartbeat; a bad one ends the stream with
        # its status (the client re-registers or reports, then reopens).
        # Heartbeats are recorded as they arrive, apart from the answers: an
        # answer may wait for the connection (behind a big Watch event on a
        # busy client), and a handler waiting with it would leave the next
        # heartbeats unread until the replica timed out.
        answers: asyncio.Queue = asyncio.Queue()

        async def record() -> None:
            try:
                async for request in request_iterator:
                    _check_request(request, self.max_request_bytes)
                    validation.check_job_field(request.job, allow_empty=True)
                    validation.check_heartbeat(request)
                    response = self.runtime.heartbeat(request)
                    if request.ack:
                        answers.put_nowait(response)
                answers.put_nowait(None)
            except FthsdpError as e:
                answers.put_nowait(e)
            except Exception as e:  # noqa: BLE001 - reported as INTERNAL, logged
                log.exception("HeartbeatStream failed")
                answers.put_nowait(e)

        reader = asyncio.create_task(record())
        try:
            while (answer := await answers.get()) is not None:
                if isinstance(answer, FthsdpError):
                    await context.abort(status_code_for(answer), str(answer))
                if isinstance(answer, Exception):
                    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the coordinator's log")
                yield answer
        finally:
            reader.cancel()

    async def Pings(self, request_iterator, context):
        # A host's ranks' pings, coalesced by its agent's relay: each taken as
        # a HeartbeatStream message is; a refused one is answered alone (its
        # rank's local stream ends with the status) and the others go on. The
        # hosts a batch names are heartbeats of their Host streams. The stream
        # is one heartbeat sender of each job it carries, while it is open.
        senders: set[str] = set()
        await context.send_initial_metadata(((RANK_DIGESTS, "1"),))  # it reads PingBatch.digests
        try:
            async for batch in request_iterator:
                try:
                    _check_request(batch, self.max_request_bytes)
                    refusals = self.take_batch(batch, senders)
                except FthsdpError as e:  # the batch's own fields: the stream ends with the status
                    await context.abort(status_code_for(e), str(e))
                for refusal in refusals:
                    yield refusal
        finally:
            for job in senders:
                self.runtime.job(job).ping_streams -= 1

    def take_batch(self, batch: pb.PingBatch, senders: set[str]) -> list[pb.PingRefused]:
        """One batch of a Pings stream whose jobs so far are ``senders``: the hosts it names beat, its pings
        and digests are taken; returns the refused ones (raises FthsdpError for the batch's own fields).
        Apart from the stream so that benchmarks/host_scale.py takes batches as the stream does."""
        validation.check_ping_batch(batch)
        if batch.hosts:  # a follower, or a job it does not serve: the stream ends with the status
            self._send_for(batch.job, senders)
            self.runtime.hosts_beat(batch.job, batch.hosts)
        refusals: list[pb.PingRefused] = []
        # Names checked once per batch: a host's or a group's ranks name the same job and group.
        jobs: set[str] = set()
        replicas: set[str] = set()
        counted: dict[str, int] = {}
        for ping in batch.pings:
            try:
                self._batch_job(ping.job, jobs, senders)
                if ping.shard_rank > 0:  # nearly all of them: a rank's liveness and progress alone
                    validation.check_rank_ping(ping, replicas)
                    self.runtime.batched_rank_ping(ping)
                else:
                    validation.check_heartbeat(ping, replicas)
                    if ping.ack:
                        raise InvalidRequest("a batched ping asks for no answer (ack): send it on "
                                             "HeartbeatStream")
                    self.runtime.heartbeat(ping, batched=True, counted=False)
                counted[ping.job] = counted.get(ping.job, 0) + 1
            except FthsdpError as e:
                refusals.append(pb.PingRefused(replica_id=ping.replica_id, shard_rank=ping.shard_rank,
                                               incarnation=ping.incarnation, code=status_code_for(e).value[0],
                                               details=str(e)))
        for digest in batch.digests:
            try:
                self._batch_job(digest.job, jobs, senders)
                validation.check_rank_digest(digest, replicas)
                self.runtime.batched_rank_digest(digest)
                counted[digest.job] = counted.get(digest.job, 0) + len(digest.ranks)
            except FthsdpError as e:
                for rank in digest.ranks:  # each rank's local stream ends with the status
                    refusals.append(pb.PingRefused(replica_id=digest.replica_id, shard_rank=rank,
                                                   incarnation=digest.incarnation,
                                                   code=status_code_for(e).value[0], details=str(e)))
        for job, n in counted.items():
            self.runtime.count_heartbeats(job, n)
        return refusals

    def _batch_job(self, job: str, jobs: set[str], senders: set[str]) -> None:
        """A job named in a batch: checked once per batch (``jobs``), and the stream one of its senders."""
        if job not in jobs:
            validation.check_job_field(job, allow_empty=True)
            jobs.add(job)
            self._send_for(job, senders)

    def _send_for(self, job: str, senders: set[str]) -> None:
        """The Pings stream carries ``job``'s heartbeats: one sender more for its pace (once per stream)."""
        if job not in senders:
            self.runtime.job(job).ping_streams += 1
            senders.add(job)

    async def Session(self, request_iterator, context):
        # fthsdp/coordinator/serving/session_stream.py
        async for item in self._relay(session_stream.serve, request_iterator, context):
            yield item

    async def Host(self, request_iterator, context):
        # fthsdp/coordinator/hosts/stream.py; with mutual TLS, the host's certificate names whom it speaks for.
        serve = functools.partial(host_stream.serve, names=certificate_names(context))
        async for item in self._relay(serve, request_iterator, context):
            yield item

    async def _relay(self, serve, request_iterator, context):
        """A bidirectional stream served by ``serve``; errors mapped as everywhere else."""
        stream = serve(self.runtime, aiter(request_iterator),
                       lambda request: _check_request(request, self.max_request_bytes))
        try:
            async for item in stream:
                if isinstance(item, FthsdpError):
                    await context.abort(status_code_for(item), str(item))
                if isinstance(item, Exception):
                    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the coordinator's log")
                yield item
        except FthsdpError as e:
            await context.abort(status_code_for(e), str(e))
        finally:
            await stream.aclose()

    async def Watch(self, request, context):
        # A server stream cannot use the unary wrapper; same mapping inline.
        try:
            _check_request(request, self.max_request_bytes)
            validation.check_job_field(request.job, allow_empty=True)
            validation.check_watch(request)
            stream = self.runtime.watch(request)
            first = await anext(stream)
        except FthsdpError as e:
            await context.abort(status_code_for(e), str(e))
            return
        try:
            yield first
            async for event in stream:
                yield event
        finally:
            # Runs the stream's cleanup now (marking the replica disconnected)
            # rather than whenever the generator is garbage-collected.
            await stream.aclose()

    @_edge
    async def Leave(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_leave(request)
        await self.runtime.leave(request)
        return pb.LeaveResponse()

    @_edge
    async def ReportAgentEvent(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_agent_event(request)
        self.runtime.agent_event(request)
        return pb.AgentEventResponse()

    @_edge
    async def ReportReach(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_reach_report(request)
        job = self.runtime.job(request.job)
        if job.state.reach_report(request.replica_id, request.shard_rank, request.probe_id,
                                  list(request.reached), list(request.unreached), request.session_id,
                                  request.incarnation):
            self.runtime.wake()  # a replica kept out may catch up now
        return pb.ReachReportResponse()

    @_edge
    async def Status(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        if not self.runtime.leading:
            return await self.runtime.follower_status(request)
        return self.runtime.status(request)

    @_edge
    async def Drain(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_replica_id(request.replica_id)
        await self.runtime.set_flags(request.job, request.replica_id, drain=True)
        return pb.DrainResponse()

    @_edge
    async def Cordon(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_replica_id(request.replica_id)
        await self.runtime.set_flags(request.job, request.replica_id, cordoned=request.cordoned)
        return pb.CordonResponse()

    @_edge
    async def GiveUpState(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_give_up(request)
        return await self.runtime.give_up_state(request, context.peer() or "")

    @_edge
    async def RestoreCheckpoint(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_restore(request)
        return await self.runtime.restore_checkpoint(request, context.peer() or "")

    @_edge
    async def ReopenJob(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_reopen(request)
        return await self.runtime.reopen_job(request, context.peer() or "")

    @_edge
    async def Inject(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
        validation.check_inject(request)
        return self.runtime.inject(request, context.peer() or "")
