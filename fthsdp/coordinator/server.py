"""Server factory: bind (port 0 allowed), wire the services, return the address.

Besides the Coordinator service the server runs the standard gRPC health
service (so Kubernetes probes and grpc-health-probe work) and server reflection
(so grpcurl and other generic clients can list and call it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fthsdp.client import SERVER_KEEPALIVE
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.serving.http_server import HttpServer, serve_http
from fthsdp.coordinator.serving.servicer import CoordinatorServicer, add_to_server
from fthsdp.coordinator.serving.web import WebApp
from fthsdp.coordinator.store import Store, open_store
from fthsdp.coordinator.store.leadership import Leadership
from fthsdp.core.auth import AccessInterceptor
from fthsdp.core.credentials import read_token_file
from fthsdp.core.errors import ConfigError
from fthsdp.core.names import split_host_port
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name

# Keepalive pings find peers that vanished without closing their connection (a
# cut cable, a frozen host) so their Watch streams end; the transport limit is
# above --max-request-bytes, which the servicer enforces with a clear message.
SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    # BDP probing pings a connection whenever data arrives, to size windows
    # for bulk transfers; with 10,000 connections of small messages it only
    # adds sends (a third of the coordinator's time was in sendmsg/write).
    ("grpc.http2.bdp_probe", 0),
    *SERVER_KEEPALIVE,
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    # gRPC core cancels calls that arrive while more than a few thousand wait
    # for the application (measured: 3,000 Registers at once lost 20% as
    # CANCELLED). A job starting is exactly that burst; let it queue.
    ("grpc.server.max_pending_requests", 1 << 17),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 17),
    # The asyncio server takes a new call only every few turns of its event
    # loop: in a burst (10,000 replicas starting) calls wait their turn for
    # a while. gRPC core cancels a call that waited 30 s,
    # whose client retries it, which only adds to the queue.
    ("grpc.server_max_unrequested_time_in_server", 3600),
)


@dataclasses.dataclass
class RunningCoordinator:
    """A started coordinator. ``address`` is HOST:PORT with the real port."""

    address: str
    port: int
    server: grpc.aio.Server
    runtime: CoordinatorRuntime
    store: Store
    health: health.aio.HealthServicer
    metrics_address: str = ""
    """HOST:PORT of the HTTP server (metrics, status page, JSON API), if --metrics-port is on."""
    metrics_server: HttpServer | None = None
    leadership: Leadership | None = None
    lost: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set when this coordinator led and lost its lease: the process should exit."""
    _leading_task: asyncio.Task | None = None

    async def stop(self, grace: float | None = 0.5) -> None:
        # Decisions stop first: the Watch streams that the shutdown closes must
        # not read as replicas failing, or a rolling restart of the
        # coordinator would empty the quorum in the store.
        if self._leading_task is not None:
            self._leading_task.cancel()
        await self.runtime.stop()
        if self.leadership is not None:
            await asyncio.to_thread(self.leadership.resign)  # a follower takes over at once
        if self.metrics_server is not None:
            await self.metrics_server.wait_closed()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        self.store.close()

    async def wait(self) -> None:
        await self.server.wait_for_termination()


def advertised_address(config: CoordinatorConfig, port: int) -> str:
    if config.advertise:
        return config.advertise
    host, _ = split_host_port(config.bind)
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}"


async def start_coordinator(config: CoordinatorConfig, store: Store | None = None) -> RunningCoordinator:
    """Open the store, load every job, bind and start serving.

    Raises ConfigError (bad store URL, port taken) or StoreUnavailable (etcd
    down) with a one-line message; the caller turns those into an exit code.
    """
    store = store or open_store(config.store, timeout=config.store_timeout)
    try:
        store.check()
        token = read_token_file(config.token_file)
        admin_token = read_token_file(config.admin_token_file, "--admin-token-file")
        server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[AccessInterceptor(token, admin_token)])
        try:
            if config.tls_cert:
                tls = config.tls
                credentials = grpc.ssl_server_credentials(
                    [(tls.read("key"), tls.read("cert"))], root_certificates=tls.read("ca"),
                    require_client_auth=bool(config.tls_ca),
                )
                port = server.add_secure_port(config.bind, credentials)
            else:
                port = server.add_insecure_port(config.bind)
        except RuntimeError as e:
            raise ConfigError(f"cannot listen on {config.bind}: {e}") from e
        if port == 0:
            raise ConfigError(f"cannot listen on {config.bind}: the address is in use or not local")
        leader = advertised_address(config, port)
        leadership = Leadership(store, f"{config.store_prefix}/leader", leader, config.leader_ttl,
                                sole=config.store == "memory")
        # Every change of a job's ledger is conditioned on the leader's key as this coordinator holds it.
        runtime = CoordinatorRuntime(config, store, leader, guard=leadership.held)
        if await leadership.try_once():
            await runtime.start()
        runtime.leader_hint = leadership.leader
        add_to_server(CoordinatorServicer(runtime, config.max_request_bytes), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        await server.start()
        # Alive either way (""); the service itself only while leading, so that
        # a Kubernetes Service routes to the leader.
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set(SERVICE_NAME, _serving(runtime.leading))
        metrics_server, metrics_address = None, ""
        if config.metrics_port >= 0:
            host, _ = split_host_port(config.bind)
            try:
                web = WebApp(runtime, config, token)
                metrics_server = await serve_http(web.handle, host.strip("[]"), config.metrics_port)
            except OSError as e:
                raise ConfigError(f"cannot serve HTTP (metrics, status page) on port {config.metrics_port}: "
                                  f"{e.strerror or e}") from e
            bound = metrics_server.sockets[0].getsockname()
            metrics_address = f"{host}:{bound[1]}"
    except BaseException:
        store.close()
        raise
    log.info("coordinator serving jobs %s on %s (advertised as %s)", ",".join(config.job), config.bind, leader)
    running = RunningCoordinator(
        leader, port, server, runtime, store, health_servicer, metrics_address, metrics_server, leadership
    )
    running._leading_task = asyncio.create_task(_lead(running), name="fthsdp-leadership")
    return running


def _serving(leading: bool):
    return health_pb2.HealthCheckResponse.SERVING if leading else health_pb2.HealthCheckResponse.NOT_SERVING


async def _lead(running: RunningCoordinator) -> None:
    """Follow until elected, then lead until the lease is lost."""
    leadership, runtime = running.leadership, running.runtime
    assert leadership is not None  # serve() elects with one before it starts this task
    while not leadership.leading:
        await asyncio.sleep(leadership.ttl / 3)
        if not await leadership.try_once():
            runtime.leader_hint = leadership.leader
            continue
        await runtime.start()
        runtime.leader_hint = leadership.leader
        await running.health.set(SERVICE_NAME, _serving(True))
    await leadership.hold()
    await runtime.stop()
    await running.health.set(SERVICE_NAME, _serving(False))
    running.lost.set()
