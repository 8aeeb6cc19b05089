"""The gRPC edge: validate, call the runtime, map typed errors to status codes.

No membership logic lives here; every method is a few lines over
``CoordinatorRuntime``.
"""

from __future__ import annotations

import functools
import logging

import grpc

from coordinator import validation
from coordinator.errors import (
    FthsdpError,
    InvalidRequest,
    LostOwnership,
    NotFound,
    StaleSession,
    StoreUnavailable,
)
from coordinator.runtime import CoordinatorRuntime
from protos.fthsdp.v1 import coordinator_pb2 as pb
from protos.fthsdp.v1 import coordinator_pb2_grpc as pb_grpc

log = logging.getLogger("fthsdp.coordinator")

STATUS_OF = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (StaleSession, grpc.StatusCode.FAILED_PRECONDITION),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (LostOwnership, grpc.StatusCode.ABORTED),
)


def status_code_for(error: FthsdpError) -> grpc.StatusCode:
    for kind, code in STATUS_OF:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _edge(method):
    """Turn typed errors into gRPC statuses and anything else into INTERNAL."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            validation.check_size(request, self.max_request_bytes)
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

    async def Watch(self, request, context):
        # A server stream cannot use the unary wrapper; same mapping inline.
        try:
            validation.check_size(request, self.max_request_bytes)
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
    async def Status(self, request, context):
        validation.check_job_field(request.job, allow_empty=True)
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
