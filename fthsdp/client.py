"""A synchronous client for a list of coordinator addresses.

Calls go to the coordinator that answered last; when it is unreachable
(UNAVAILABLE, DEADLINE_EXCEEDED) the client moves on to the next address, so a
list of coordinators behaves like one service. Retries of transient failures
and keepalive are declared as channel options, the way gRPC intends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc

from fthsdp.core.credentials import TlsFiles, bearer_metadata
from fthsdp.core.errors import ConfigError, CoordinatorUnavailable, RequestRejected
from fthsdp.core.names import split_host_port
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc

_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "fthsdp.v1.Coordinator", "method": m} for m in ("Status", "Heartbeat")],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "0.5s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

CHANNEL_OPTIONS = (
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.enable_retries", 1),
    # Messages here are small: BDP probing (a ping per burst of data, to size
    # the flow-control window for bulk transfers) only costs syscalls.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC's default reconnect backoff grows to 120 s: after an outage of L
    # seconds the replicas came back scattered over about 0.6 L, and one more
    # than a heartbeat timeout behind the others was dropped although healthy.
    # Bounded to a second (gRPC adds jitter), they return together.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

SERVER_KEEPALIVE = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
)
"""What a server of these channels sets (the coordinator's, an agent's relay
and its peer server): their pings come every 10 s, idle streams included,
and gRPC's default server answers pings more often than every 5 minutes
without data with GOAWAY too_many_pings, which cut the ranks' hang-watch
streams to the relay every minute or two."""

# CANCELLED from a server means it shed the call (gRPC core drops calls that
# waited too long for an overloaded application): as transient as the others.
MOVE_ON = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def parse_addresses(text: str | Sequence[str], what: str = "--coordinator") -> list[str]:
    """'h1:p1,h2:p2' (or a list of such strings) -> ['h1:p1', 'h2:p2']."""
    items = [text] if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                split_host_port(part, what)
            except ValueError as e:
                raise ConfigError(str(e)) from e
            out.append(part)
    if not out:
        raise ConfigError(f"{what}: give at least one HOST:PORT")
    return out


class CoordinatorClient:
    def __init__(
        self, addresses: Sequence[str], timeout: float = 5.0, token: str = "", tls: TlsFiles | None = None
    ) -> None:
        """``tls``: connect over TLS, trusting ``tls.ca`` (the system roots
        if empty) and presenting ``tls.cert`` if given; None: plain text."""
        self.addresses = list(addresses)
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        self._credentials = None
        if tls is not None and tls.enabled:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.read("ca"), private_key=tls.read("key"), certificate_chain=tls.read("cert")
            )
        self._channels: dict[str, grpc.Channel] = {}
        self._current = 0

    def stub(self, address: str) -> pb_grpc.CoordinatorStub:
        channel = self._channels.get(address)
        if channel is None:
            # A Unix socket is the agent's relay (fthsdp/agent/node/relay/): a local
            # channel, which TLS would add nothing to; the relay goes on over TLS.
            if self._credentials is not None and not address.startswith("unix:"):
                channel = grpc.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS)
            else:
                channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return pb_grpc.CoordinatorStub(channel)

    def call(self, method: str, request, timeout: float | None = None):
        """Call ``method`` on the first coordinator that answers."""
        errors = []
        n = len(self.addresses)
        for k in range(n):
            index = (self._current + k) % n
            address = self.addresses[index]
            try:
                response = getattr(self.stub(address), method)(
                    request, timeout=timeout or self.timeout, metadata=self._metadata
                )
            except grpc.RpcError as e:
                if e.code() in MOVE_ON:
                    errors.append(f"{address}: {e.code().name.lower()}")
                    continue
                raise RequestRejected(e.code(), f"{address}: {e.details()}") from e
            self._current = index
            return response
        raise CoordinatorUnavailable(f"no coordinator answered ({'; '.join(errors)})")

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata for calls made on ``stub()`` directly (a Watch stream)."""
        return self._metadata

    def current_address(self) -> str:
        """The address calls go to now (the last one that answered)."""
        return self.addresses[self._current]

    def advance(self) -> str:
        """Move on to the next coordinator in the list and return its address."""
        self._current = (self._current + 1) % len(self.addresses)
        return self.addresses[self._current]

    def status(self, job: str = "") -> pb.StatusResponse:
        """The job's status from the leader: a follower's answer names it, and is
        returned as it is only when the leader cannot be reached."""
        request = pb.StatusRequest(job=job)
        response = self.call("Status", request)
        if response.follower and response.leader and response.leader != self.current_address():
            try:
                return self.stub(response.leader).Status(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError:
                pass
        return response

    def drain(self, job: str, replica_id: str) -> None:
        self.call("Drain", pb.DrainRequest(job=job, replica_id=replica_id))

    def cordon(self, job: str, replica_id: str, cordoned: bool = True) -> None:
        self.call("Cordon", pb.CordonRequest(job=job, replica_id=replica_id, cordoned=cordoned))

    def give_up_state(self, job: str, step: int, requested_by: str = "") -> pb.GiveUp:
        """Start a job over whose state is lost at exactly ``step``; raises
        RequestRejected (FAILED_PRECONDITION) if it is not."""
        request = pb.GiveUpStateRequest(job=job, step=step, requested_by=requested_by)
        return self.call("GiveUpState", request).give_up

    def restore_checkpoint(self, job: str, step: int, requested_by: str = "") -> pb.Restore:
        """Restore a job whose state is lost from its checkpoint of ``step``;
        raises RequestRejected (FAILED_PRECONDITION) if the state is not lost,
        NotFound if no complete checkpoint of that step is recorded."""
        request = pb.RestoreCheckpointRequest(job=job, step=step, requested_by=requested_by)
        return self.call("RestoreCheckpoint", request).restore

    def reopen_job(self, job: str, step: int, requested_by: str = "") -> pb.JobFinished:
        """Reopen a job that finished at exactly ``step``; raises
        RequestRejected (FAILED_PRECONDITION) if it did not."""
        request = pb.ReopenJobRequest(job=job, step=step, requested_by=requested_by)
        return self.call("ReopenJob", request).finished

    def use_admin_token(self, token: str) -> None:
        """Present the coordinator's admin token on every further call
        (fthsdp/core/auth.py); '' presents none."""
        from fthsdp.core.auth import ADMIN_METADATA, admin_metadata

        self._metadata = (*(m for m in self._metadata if m[0] != ADMIN_METADATA), *admin_metadata(token))

    def inject(self, job: str, replica_id: str, kind: pb.FaultKind, seconds: float = 0.0, steps: int = 0,
               requested_by: str = "") -> pb.FaultInjection:
        """Inject a fault into a running replica (needs the admin token:
        ``use_admin_token``); raises RequestRejected (PERMISSION_DENIED,
        UNAUTHENTICATED, NOT_FOUND, FAILED_PRECONDITION) when refused."""
        request = pb.InjectRequest(job=job, replica_id=replica_id, kind=kind, seconds=seconds, steps=steps,
                                   requested_by=requested_by)
        return self.call("Inject", request).injection

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

