"""Bearer-token authentication of the coordinator's gRPC surface.

One shared secret per deployment, read from a file (a Kubernetes Secret or a
systemd credential mounted read-only): every call carries
``authorization: Bearer <token>`` metadata, and the server rejects any call
without it with UNAUTHENTICATED before the call reaches the servicer, so a
rejected call changes nothing. The standard health service stays open, so
that probes need no secret. The catch-up transport between replicas takes
the same token (fthsdp/agent/training/catchup/server.py).

Every call of the Coordinator service is classified in one table,
``METHOD_ACCESS`` (read, replica or admin), and one interceptor,
``AccessInterceptor``, enforces it before any call reaches the servicer, so
that no servicer method can forget a check. A call that is not in the table
is refused (fail closed); tests/test_access_table.py walks the service
descriptor, so an RPC added without a class fails the suite.

Admin calls may need a second secret, the admin token
(``--admin-token-file``), carried in its own metadata key, ``fthsdp-admin-token``,
besides the bearer token that every call carries: the job's token is in
every agent's and every rank's hands, the admin token only in the operators'.

* ``Inject`` always needs it; a coordinator without an admin token refuses
  it (PERMISSION_DENIED), so no deployment gets fault injection by accident;
* the other admin calls need it once one is configured, and work as before
  without one (existing deployments keep working).

A call without the admin token gets PERMISSION_DENIED (it may be a
legitimate job client, not allowed this), one with another token
UNAUTHENTICATED (a bad credential), as the bearer token's checks answer.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable, Mapping
from types import MappingProxyType

import grpc

from fthsdp.core.errors import FthsdpError

OPEN_SERVICES = ("/grpc.health.v1.Health/",)
"""Method prefixes served without a token (probes)."""

ADMIN_METADATA = "fthsdp-admin-token"
"""The metadata key of the admin token (lower case, as gRPC requires)."""
COORDINATOR_SERVICE = "fthsdp.v1.Coordinator"
"""The full name of the service that ``METHOD_ACCESS`` classifies."""


class Access(enum.Enum):
    """Who may make a call of the Coordinator service."""

    READ = "read"
    """Observes the job and changes nothing (status, watches): the job token."""
    REPLICA = "replica"
    """What agents and ranks call to take part in the job: the job token."""
    ADMIN = "admin"
    """Changes the job on an operator's word: the admin token, once one is configured."""


METHOD_ACCESS: Mapping[str, Access] = MappingProxyType({
    "Register": Access.REPLICA,
    "Heartbeat": Access.REPLICA,
    "HeartbeatStream": Access.REPLICA,
    "Pings": Access.REPLICA,
    "Session": Access.REPLICA,
    "Leave": Access.REPLICA,
    "ReportAgentEvent": Access.REPLICA,
    "Host": Access.REPLICA,
    "ReportReach": Access.REPLICA,
    "Watch": Access.READ,
    "Status": Access.READ,
    "Drain": Access.ADMIN,
    "Cordon": Access.ADMIN,
    "GiveUpState": Access.ADMIN,
    "RestoreCheckpoint": Access.ADMIN,
    "ReopenJob": Access.ADMIN,
    "Inject": Access.ADMIN,
})
"""Every call of the Coordinator service, by its method name, and who may make it."""

ADMIN_METHODS = tuple(name for name, access in METHOD_ACCESS.items() if access is Access.ADMIN)
"""Calls that need the admin token when one is configured."""
ALWAYS_ADMIN = ("Inject",)
"""Calls refused altogether without a configured admin token."""


class PermissionDenied(FthsdpError):
    """An admin call without the admin token, or one the coordinator has
    turned off (gRPC PERMISSION_DENIED): nothing is done."""


class Unauthenticated(FthsdpError):
    """An admin call with a wrong admin token (gRPC UNAUTHENTICATED)."""


def admin_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents the admin ``token`` (none for an empty one)."""
    return ((ADMIN_METADATA, token),) if token else ()


def check_admin(method: str, metadata, expected: str) -> None:
    """Raise unless the call ``method`` with ``metadata`` (gRPC's
    invocation metadata: key, value pairs) may act, given the configured
    admin token ``expected`` ('' for none)."""
    if method not in ADMIN_METHODS or (not expected and method not in ALWAYS_ADMIN):
        return
    if not expected:
        raise PermissionDenied(f"{method} is off on this coordinator: it runs without an admin token; start it "
                               "with --admin-token-file (FTHSDP_ADMIN_TOKEN_FILE) to allow it")
    given = dict(metadata or ()).get(ADMIN_METADATA, "")
    if not given:
        raise PermissionDenied(f"{method} is an admin call: present the coordinator's admin token "
                               "(fthsdp --admin-token-file FILE, or FTHSDP_ADMIN_TOKEN_FILE)")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Unauthenticated(f"{method}: wrong admin token")


class AccessInterceptor(grpc.aio.ServerInterceptor):
    """Enforces ``METHOD_ACCESS`` before a call reaches the servicer: the
    bearer ``job_token`` (when set) on every call but OPEN_SERVICES, the
    ``admin_token`` on admin calls (``check_admin``), and a refusal for a
    Coordinator call that the table does not classify."""

    def __init__(self, job_token: str, admin_token: str) -> None:
        self._expected = f"Bearer {job_token}".encode() if job_token else b""
        self._admin_token = admin_token

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_SERVICES):
            return handler
        metadata = details.invocation_metadata or ()
        if self._expected:
            given = dict(metadata).get("authorization", "")
            if not hmac.compare_digest(given.encode(), self._expected):
                message = "missing bearer token" if not given else "wrong bearer token"
                return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, message)
        service, _, name = details.method.lstrip("/").rpartition("/")
        if service != COORDINATOR_SERVICE:
            return handler
        if name not in METHOD_ACCESS:
            return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED,
                            f"{name} has no access class on this coordinator (fthsdp/core/auth.py): refused")
        try:
            check_admin(name, metadata, self._admin_token)
        except PermissionDenied as e:
            return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED, str(e))
        except Unauthenticated as e:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED, str(e))
        return handler


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that aborts with ``code``."""

    async def refuse(request, context: grpc.aio.ServicerContext):
        await context.abort(code, message)

    async def refuse_stream(request, context: grpc.aio.ServicerContext):
        await context.abort(code, message)
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
