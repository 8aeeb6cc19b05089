"""Bearer-token authentication of the coordinator's gRPC surface.

One shared secret per deployment, read from a file (a Kubernetes Secret or a
systemd credential mounted read-only): every call carries
``authorization: Bearer <token>`` metadata, and the server rejects any call
without it with UNAUTHENTICATED before the call reaches the servicer, so a
rejected call changes nothing. The standard health service stays open, so
that probes need no secret. The catch-up transport between replicas takes
the same token (agent/catchup_server.py).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import grpc


OPEN_SERVICES = ("/grpc.health.v1.Health/",)
"""Method prefixes served without a token (probes)."""


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects every call but OPEN_SERVICES that lacks the right bearer token."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_SERVICES):
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(given.encode(), self._expected):
            return handler
        message = "missing bearer token" if not given else "wrong bearer token"
        return _refusal(handler, message)


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts with UNAUTHENTICATED."""

    async def refuse(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def refuse_stream(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    behaviour = refuse_stream if handler.response_streaming else refuse
    return kind(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
