"""What links one rank to its job: opened by ``Manager.start()``, let go when the replica stops.

* the rendezvous store of every quorum whose first member this replica
  group is (rank 0 hosts it);
* the coordinator session (rank 0; the other ranks observe) and what
  listens to its pushes: a drain asked there, the quorums, hang notices,
  injected faults, reachability probes;
* the replica group's own ranks (``ReplicaGroup``);
* the catch-up server that lets joiners copy this rank's state.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import ssl

import torch.distributed as dist

from fthsdp.agent.injection import RankFaults
from fthsdp.agent.training.catchup import tls as catchup_tls
from fthsdp.agent.training.catchup.client import SourceClient
from fthsdp.agent.training.catchup.group import GroupChannel, numeric_host
from fthsdp.agent.training.catchup.server import CatchUpServer
from fthsdp.agent.training.catchup.source import ServedState
from fthsdp.agent.training.config import ManagerConfig
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.session.hang_notice import HangNotices
from fthsdp.agent.training.session.lifecycle import Lifecycle
from fthsdp.agent.training.session.membership import Membership
from fthsdp.agent.training.session.observer import Observer
from fthsdp.agent.training.session.reach_probe import ReachProbes
from fthsdp.agent.training.session.replica_group import ReplicaGroup
from fthsdp.agent.training.step.clock import StepClock
from fthsdp.agent.training.transport import Transport
from fthsdp.client import CoordinatorClient
from fthsdp.core.credentials import TlsFiles
from fthsdp.core.errors import ConfigError, FthsdpError
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.connection")

SESSION_TIMEOUT = 5.0
"""Seconds each call to the coordinator may take (a Heartbeat, a Leave, a probe's report)."""


class JobConnection:
    def __init__(self, config: ManagerConfig, source: ServedState, lifecycle: Lifecycle, clock: StepClock,
                 group_timeout: float, transport: Transport) -> None:
        """Open every link (the session is not started yet: ``start_session``).
        ``transport``: the cross-replica one, which catch-up's group transfers use too."""
        self.config = config
        self._lifecycle = lifecycle
        self.leader = config.shard_rank == 0
        """Rank 0 of the replica group holds its session with the coordinator."""
        self.store: dist.TCPStore | None = None
        address = "unused:0"
        if self.leader:
            self.store = dist.TCPStore(config.host, 0, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=config.timeout))
            address = f"{config.host}:{self.store.port}"
        self.view = QuorumView(config.replica_id)
        """The coordinator's pushes: the one copy every part of this rank reads."""
        self.hangs = HangNotices(config.replica_id, config.shard_rank, config.restart_count)
        self.faults = RankFaults(config.replica_id, config.shard_rank, config.restart_count)
        """Injected hang and slow faults (`fthsdp inject`; fthsdp/agent/injection.py)."""
        self.group = ReplicaGroup(config.shard_rank, config.shard_count, group_timeout)
        self._catch_up_tls = config.tls if config.catch_up_tls else TlsFiles()
        self._source_tls: ssl.SSLContext | None = None  # the catch-up client's, made on first use
        # One address for a session's store and the HTTP connection that asks
        # for it: a source connects to a store only at the address the ask came from.
        self._data_host = numeric_host(config.host)
        channel = GroupChannel(transport, self._data_host, config.timeout)
        self._fetch_channel = channel if self._over_group(config, transport) else None
        """Whether this rank, as a joiner, fetches snapshots over a group (it always serves them so)."""
        # A source with catch-up TLS pushes nothing in the clear.
        push_channel = None if catchup_tls.uses_tls(self._catch_up_tls) else channel
        server_tls, fingerprint = catchup_tls.serving(self._catch_up_tls)
        self._server = CatchUpServer(source, config.host, token=config.token, max_rate=config.catch_up_max_rate,
                                     tls=server_tls, fingerprint=fingerprint, channel=push_channel).start()
        log.info("serving catch-up on %s (%s)", self._server.address, {
            catchup_tls.Mode.PLAIN: "http", catchup_tls.Mode.MUTUAL: "https, this node's certificate",
            catchup_tls.Mode.PINNED: f"https, ephemeral certificate sha256 {fingerprint}",
        }[catchup_tls.mode(self._catch_up_tls)])
        catch_up_addresses = self.group.all_gather_strings(self._server.address)
        # Pinned TLS: the joiners' only proof of a source's certificate, through the coordinator.
        catch_up_fingerprints = self.group.all_gather_strings(self._server.fingerprint)
        agent_ids = self.group.all_gather_strings(config.agent_id)  # one per host: each binds its reports
        # Binds the other ranks' pings to this incarnation (RegisterRequest.incarnation).
        incarnation = str(self.group.broadcast_json(secrets.token_hex(16) if self.leader else None))
        m: Membership | Observer
        if self.leader:
            m = Membership(config.coordinator, config.job, config.replica_id, address, config.shard_count, 0,
                           token=config.token, tls=config.tls, view=self.view, catch_up_addresses=catch_up_addresses,
                           restart_count=config.restart_count, progress=clock.progress, agent_ids=agent_ids,
                           incarnation=incarnation,
                           catch_up_fingerprints=catch_up_fingerprints if any(catch_up_fingerprints) else ())
        else:
            client = CoordinatorClient(config.coordinator, timeout=SESSION_TIMEOUT, token=config.token, tls=config.tls)
            m = Observer(client, config.job, config.replica_id, config.shard_rank, self.view, progress=clock.progress,
                         incarnation=incarnation)
        self.membership = m
        """Rank 0's session with the coordinator, or another rank's observation of it."""
        self.reporting = m.reporting
        """What this rank tells the coordinator: published whole by the thread that owns it."""
        # First: a drain is known before the quorum that no longer includes this replica.
        m.add_listener(self._on_event, before_view=True)
        m.add_listener(self.hangs)
        m.add_listener(self.faults)
        m.add_listener(ReachProbes(config.replica_id, config.shard_rank, m.report_reach))

    def start_session(self) -> None:
        """Register with the coordinator (rank 0), or follow rank 0's place (the others)."""
        self.membership.start()

    def hold_for_lease(self) -> None:
        """Before the update of a step this replica trains: wait while its
        member lease is out (rank 0, which holds the session; the other
        ranks wait for it at the step boundary's group agreement), or raise
        ``Evicted`` once a push takes it out (fthsdp/agent/training/session/lease.py)."""
        if isinstance(self.membership, Membership):
            self.membership.lease.hold(self._out_of_quorum)

    def _out_of_quorum(self) -> str:
        view = self.view
        with view.cond:
            if view.quorum is None or view.includes_me(view.quorum):
                return ""
            return f"the newest quorum ({view.newest_id()}) does not include this replica{view.out_because()}"

    def drain_requested(self) -> bool:
        """Asked here (SIGTERM, the coordinator's push) or in the newest push itself."""
        latest = self.view.latest
        return self._lifecycle.drain_requested or (latest is not None and latest.drain_requested)

    def source_client(self, address: str, fingerprint: str = "") -> SourceClient:
        """A connection to a catch-up source, with transfer tokens keyed by
        this job's token, and TLS whenever the coordinator uses it
        (fthsdp/agent/training/catchup/tls.py; ``fingerprint``: the source
        certificate's, as the coordinator named it, for pinned TLS)."""
        if self._source_tls is None and catchup_tls.uses_tls(self._catch_up_tls):
            self._source_tls = catchup_tls.client_context(self._catch_up_tls)
        return SourceClient(address, self.config.token, timeout=self.config.timeout, tls=self._source_tls,
                            channel=self._fetch_channel, joiner=self.config.replica_id, fingerprint=fingerprint,
                            bind=self._data_host)

    def _over_group(self, config: ManagerConfig, transport: Transport) -> bool:
        """``--catch-up-transport``: auto picks the group on NCCL without TLS."""
        tls = catchup_tls.uses_tls(self._catch_up_tls)
        if config.catch_up_transport == "distributed" and tls:
            raise ConfigError("--catch-up-transport distributed would send the state unencrypted while catch-up "
                              "uses TLS: choose http, or turn catch-up TLS off (FTHSDP_CATCH_UP_TLS=0)")
        if config.catch_up_transport == "auto":
            return transport.name == "nccl" and not tls
        return config.catch_up_transport == "distributed"

    def close(self, reason: str, failed: bool) -> None:
        """Tell the coordinator this replica leaves, and stop serving joiners."""
        try:
            self.membership.leave(reason, failed=failed)
        except FthsdpError as e:
            log.warning("could not tell the coordinator that this replica leaves: %s", e)
            self.membership.close()
        self._server.close()

    def _on_event(self, event: pb.WatchEvent) -> None:
        """The coordinator's push (its watch thread): a drain asked there (`fthsdp drain`, the admin endpoint)."""
        if event.drain_requested:
            self._lifecycle.request_drain("the coordinator")
