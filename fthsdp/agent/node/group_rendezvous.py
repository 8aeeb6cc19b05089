"""A node agent's part in its replica group's rendezvous rounds (issue 39).

With ``--nnodes`` above 1 (and no ``--master-port``), or ``--spare``, the
supervisor (fthsdp/agent/node/supervisor.py) asks this object for each
incarnation of its group: ``next_round`` joins the group's round through
the coordinator and returns the node rank, the store and the round number
once every host joined (or why the agent ends); while the ranks run,
``round_ended`` says whether the coordinator ended the round (another host
failed), and ``failed`` reports this host's own failure, which ends it on
every host. The protocol is the state machine in
fthsdp/agent/node/group_round.py; this class feeds it the coordinator's
pushes (fthsdp/agent/node/host_link.py) and carries out what it returns:
opening a fresh store for each join (fthsdp/agent/store_host.py, a child
process, since the agent imports no torch), sending, starting. Every hello
says the agent's incarnation (drawn at start) and the group's hosts by node
rank as last pushed, so that a coordinator that restarted knows them all,
a host lost meanwhile included (fthsdp/coordinator/hosts/claims.py).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable

from fthsdp.agent.node.config import AgentConfig
from fthsdp.agent.node.group_round import AgentRound, Do, Event, Kind, Phase, step
from fthsdp.agent.node.host_link import HostLink
from fthsdp.core.child_process import die_with_parent_prefix
from fthsdp.core.names import split_host_port
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent")


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One round of the group, as this host runs it."""

    round: int
    node_rank: int
    store_host: str
    store_port: int
    replica_id: str
    replica_rank: int
    num_replicas: int

    def config(self, base: AgentConfig) -> AgentConfig:
        """``base`` as a static launch of this round."""
        return dataclasses.replace(base, spare=False, replica_id=self.replica_id, replica_rank=self.replica_rank,
                                   num_replicas=self.num_replicas, node_rank=self.node_rank,
                                   master_addr=self.store_host, master_port=self.store_port)


@dataclasses.dataclass(frozen=True)
class End:
    """The agent ends: ``exit_code``, saying ``reason``."""

    exit_code: int
    reason: str


class StoreHost:
    """The child process that opens a fresh TCPStore per join."""

    def __init__(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [*die_with_parent_prefix(), sys.executable, "-m", "fthsdp.agent.store_host"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def open(self) -> int:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write("open\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "port":
            raise OSError(f"the store host did not open a store (said {' '.join(line)!r}, exit "
                          f"{self._proc.poll()})")
        return int(line[1])

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def advertised_address(config: AgentConfig, env: dict[str, str]) -> str:
    """Where the group's other hosts reach this host's store: FTHSDP_ADVERTISE_HOST
    if set, else the local address this host reaches the coordinator from."""
    given = env.get("FTHSDP_ADVERTISE_HOST", "")
    if given:
        return given
    host, port = split_host_port(config.coordinators[0])
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, port))  # UDP: no packet is sent, the kernel only picks the route
            return s.getsockname()[0]
    except OSError:
        return socket.getfqdn()


class GroupRendezvous:
    def __init__(self, config: AgentConfig, env: dict[str, str], token: str,
                 link: Callable[..., HostLink] = HostLink, store: Callable[[dict[str, str]], StoreHost] = StoreHost,
                 incarnation: str = "", relay: str = "") -> None:
        """``relay``: the agent's local relay (fthsdp/agent/node/relay/), which the Host stream goes through;
        empty: the coordinators themselves."""
        self.config = config
        self.host_id = config.host_id or socket.gethostname()
        self.address = advertised_address(config, env)
        self.incarnation = incarnation or secrets.token_hex(16)
        """Drawn at start and said in every hello, to nobody else: while this agent's stream is open, the
        coordinator takes no hello under its host id from anyone else (another agent on a host of the same name,
        a caller with the job token alone); this agent reconnecting is taken."""
        self.roster: tuple[int, tuple[str, ...]] = (0, ())
        """The group's hosts by node rank as last pushed, and their round: said in every hello, so that a
        coordinator that restarted knows them (a host lost meanwhile among them)."""
        self.state = AgentRound(Phase.CONNECTING, round=0, spare=config.spare, max_restarts=config.max_restarts)
        self.replica = (config.replica_id, config.replica_rank, config.num_replicas)
        self.inbox: queue.Queue[pb.HostPush] = queue.Queue()
        self._store = store(env)
        self._joined: tuple[int, str] | None = None
        """The round this host joined last and the store it opened for it."""
        self._ended = ""
        self._link = (link([relay], token, None, self._hello, self.inbox) if relay
                      else link(config.coordinators, token, config.tls, self._hello, self.inbox))

    def _hello(self) -> pb.HostHello:
        state = self.state
        running = state.phase in (Phase.RUNNING, Phase.STOPPING)
        return pb.HostHello(
            job=self.config.job, host_id=self.host_id, replica_id=self.replica[0], replica_rank=self.replica[1],
            num_replicas=self.replica[2], nnodes=self.config.nnodes, nproc=self.config.nproc,
            rendezvous_timeout=self.config.rendezvous_timeout, round=max(state.round, 0),
            node_rank=state.node_rank if running and state.phase is Phase.RUNNING else -1,
            store=state.store if state.phase is Phase.RUNNING else "", incarnation=self.incarnation,
            address=self.address, hosts_round=self.roster[0], hosts=self.roster[1])

    # ----- what the supervisor asks ----------------------------------------------------

    def next_round(self, stopping: Callable[[float], bool]) -> Assignment | End:
        """Join the group's next round and wait until it completes (the
        assignment) or the agent must end. ``stopping(timeout)`` waits for a
        stop request at most ``timeout`` seconds and says whether there is one."""
        if self.state.phase is Phase.STOPPING:
            if (got := self._feed(Event(Kind.RANKS_STOPPED))) is not None:
                return got
        while True:
            if stopping(0.0):
                return End(0, "stopped while joining a round")
            try:
                push = self.inbox.get(timeout=self.config.monitor_interval)
            except queue.Empty:
                continue
            event = self._event(push)
            got = self._feed(event) if event is not None else None
            if got is not None:
                return got

    def round_ended(self) -> str | None:
        """While the ranks run: why the coordinator ended this round, if it did."""
        while self._ended == "":
            try:
                push = self.inbox.get_nowait()
            except queue.Empty:
                return None
            event = self._event(push)
            got = self._feed(event) if event is not None else None
            if isinstance(got, End):  # refused mid-run: a coordinator that no longer knows this host
                self._ended = got.reason
        return self._ended or None

    def failed(self, reason: str) -> None:
        """This host's ranks failed: the coordinator ends the round on every host."""
        self._feed(Event(Kind.RANKS_FAILED, reason=reason))

    def close(self, reason: str = "") -> None:
        """The agent ends; ``reason`` set: it leaves the group for good (finished, drained)."""
        leave = pb.HostLeave(round=max(self.state.round, 0), reason=reason[:1000]) if reason else None
        self._link.close(leave)
        self._store.close()

    # ----- inside ------------------------------------------------------------------------

    def _event(self, push: pb.HostPush) -> Event | None:
        """The state machine's event for a push (None: a push that only tells this agent something)."""
        which = push.WhichOneof("message")
        if which == "welcome":
            return Event(Kind.WELCOME, push.welcome.round)
        if which == "joined":
            return Event(Kind.JOIN_TAKEN, push.joined)
        if which == "complete":
            self._heard(push.complete.round, push.complete.hosts)
            return Event(Kind.ROUND_COMPLETE, push.complete.round, push.complete.node_rank, push.complete.store)
        if which == "ended":
            return Event(Kind.ROUND_ENDED, push.ended.round, reason=push.ended.reason)
        if which == "adopted":
            a = push.adopted
            if self.state.phase is not Phase.SPARE:
                return None  # said again after a reconnect that this agent had heard it: it is its group's already
            self.replica = (a.replica_id, a.replica_rank, a.num_replicas)
            self._heard(a.round, a.hosts)
            log.info("spare host %s adopted by replica group %s (replica rank %d), round %d", self.host_id,
                     a.replica_id, a.replica_rank, a.round)
            return Event(Kind.ADOPTED, a.round)
        if which == "roster":
            self._heard(push.roster.round, push.roster.hosts)
            return None
        if which == "gave_up":
            return Event(Kind.GAVE_UP, reason=push.gave_up)
        if which == "released":
            return Event(Kind.RELEASED, reason=push.released)
        return Event(Kind.JOIN_REFUSED, reason=push.refused)

    def _heard(self, round_number: int, hosts) -> None:
        """The group's hosts by node rank as of ``round_number``, if newer than those this agent knows."""
        if hosts and round_number >= self.roster[0]:
            self.roster = (round_number, tuple(hosts))

    def _feed(self, event: Event) -> Assignment | End | None:
        before = self.state
        self.state, do = step(self.state, event)
        if self.state.phase is not before.phase or self.state.round != before.round:
            log.info("host %s: round %d %s -> round %d %s (%s)", self.host_id, before.round, before.phase.value,
                     self.state.round, self.state.phase.value, event.kind.value,
                     extra={"event": "group_round", "host": self.host_id, "round": self.state.round,
                            "phase": self.state.phase.value, "cause": event.kind.value, "reason": event.reason})
        if do is Do.REJOIN and self._joined is not None:
            self._link.send(pb.HostRequest(join=pb.HostJoin(round=self.state.round, store=self._joined[1])))
        elif do in (Do.JOIN, Do.REJOIN):
            self._ended = ""
            store = f"{self.address}:{self._store.open()}"
            self._joined = (self.state.round, store)
            self._link.send(pb.HostRequest(join=pb.HostJoin(round=self.state.round, store=store)))
        elif do is Do.START_RANKS:
            host, port = split_host_port(self.state.store)
            return Assignment(self.state.round, self.state.node_rank, host, port, *self.replica)
        elif do is Do.REPORT_FAILURE:
            self._link.send(pb.HostRequest(failure=pb.HostFailure(round=self.state.round, reason=event.reason[:1000])))
        elif do is Do.STOP_RANKS:
            self._ended = event.reason or f"round {before.round} ended"
        elif do is Do.EXIT:
            return End(self.state.exit_code, self.state.reason)
        return None
