"""The hosts of one job's replica groups and their rendezvous rounds (issue 39).

Every host of a group of several hosts keeps one ``Host`` stream open
(fthsdp/coordinator/host_stream.py); this table is what the coordinator
knows of them, and applies ``rendezvous.decide`` to each group after every
change and on every tick: it completes rounds, ends them on a failure,
gives lost hosts' places to spares, and gives up on rounds that cannot
complete, pushing each outcome to the hosts concerned.

It is not stored: after a coordinator restart the agents reconnect and say
which round they run, with which node rank and store, and the table is
rebuilt from that (``hello``), as torchft's lighthouse rebuilds its quorum
from its replicas. One owner: the coordinator's event loop calls every
method; the clock is passed in.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from fthsdp.coordinator.rendezvous import (
    Action,
    Decision,
    Host,
    RendezvousRules,
    Round,
    check_join,
    decide,
)
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")

Push = Callable[[pb.HostPush | None], None]
"""Sends one message down a host's stream; None ends the stream (the agent opens it again, saying hello)."""


@dataclasses.dataclass
class Group:
    """One replica group's rounds."""

    replica_id: str
    replica_rank: int
    num_replicas: int
    nnodes: int
    nproc: int
    rendezvous_timeout: float
    current: Round
    previous: tuple[str, ...] = ()
    """The hosts by node rank of the last complete round."""
    reason: str = ""
    """The last decision's reason, for status."""
    gave_up: str = ""


@dataclasses.dataclass
class _Link:
    push: Push
    connection: int
    last_seen: float


class HostTable:
    def __init__(self, job: str, rules: RendezvousRules) -> None:
        self.job = job
        self.rules = rules
        self.hosts: dict[str, Host] = {}
        self.groups: dict[str, Group] = {}
        self._links: dict[str, _Link] = {}
        self._connections = 0
        self.replaced: dict[str, str] = {}
        """Hosts whose place a spare took while they were gone: host id -> why they are not needed."""
        self.finished = ""
        """Set (why) once the job finished: spares are released, and spares that come are too."""

    # ----- what a host's stream brings ----------------------------------------------

    def hello(self, hello: pb.HostHello, push: Push, now: float) -> int:
        """A host's stream opened; returns the connection's number (for
        ``closed``). Raises JoinRefused (one line) for a host that would form
        its group wrong; nothing is recorded then."""
        host_id = hello.host_id
        released = self.finished if not hello.replica_id else self.replaced.get(host_id, "")
        if released and (not hello.replica_id or len(self._alive(hello.replica_id, host_id)) >= hello.nnodes):
            push(pb.HostPush(released=released))
            push(None)
            return 0
        self.replaced.pop(host_id, None)
        old = self.hosts.get(host_id)
        group = self.groups.get(hello.replica_id) if hello.replica_id else None
        host = Host(host_id, hello.replica_id, hello.nnodes, hello.nproc)
        if hello.replica_id:
            members = [h for h in self.hosts.values() if h.group == hello.replica_id and h.host_id != host_id]
            current = group.current if group is not None else Round(max(hello.round, 1), now)
            check_join(host, group.nnodes if group else 0, group.nproc if group else 0, members, current)
        self._connections += 1
        self._links[host_id] = _Link(push, self._connections, now)
        if hello.replica_id and group is None:
            group = self.groups[hello.replica_id] = Group(
                hello.replica_id, hello.replica_rank, hello.num_replicas, hello.nnodes, hello.nproc,
                hello.rendezvous_timeout or self.rules.rendezvous_timeout, Round(max(hello.round, 1), now))
        if group is not None and hello.round > group.current.number:
            self._advance(group, hello.round, now, f"host {host_id} is in round {hello.round} already")
        if group is not None and hello.round and hello.round == group.current.number and hello.node_rank >= 0:
            # Back after a coordinator restart while running: the round completes again as it was.
            host = dataclasses.replace(host, joined_round=hello.round, store=hello.store)
            ranks = list(group.previous) + [""] * (group.nnodes - len(group.previous))
            if hello.node_rank < group.nnodes:
                ranks[hello.node_rank] = host_id
                group.previous = tuple(ranks)
        elif (group is not None and old is not None and old.group == group.replica_id and group.current.complete
              and host_id in group.current.ranks and old.left_round != group.current.number):
            if hello.round == group.current.number:
                # The same agent, which had joined the round but not heard it complete: it joins again, as it was.
                host = dataclasses.replace(host, joined_round=old.joined_round, store=old.store)
            else:
                # A host of the running round back with nothing running: its last incarnation died.
                self.hosts[host_id] = dataclasses.replace(old, failed_round=group.current.number,
                                                          failure="its agent came back with no ranks running")
                self._evaluate(group.replica_id, now)
        self.hosts[host_id] = host
        round_now = self.groups[host.group].current.number if host.group else 0
        push(pb.HostPush(welcome=pb.HostWelcome(host_id=host_id, round=round_now)))
        log.info("job %s: host %s connected (%s)", self.job, host_id,
                 f"group {host.group}" if host.group else "spare", extra={
                     "event": "host_connected", "job": self.job, "host": host_id, "group": host.group})
        if host.group:
            self._evaluate(host.group, now)
        else:
            self.tick(now, float("inf"))  # a spare may be what a group waits for
        return self._connections

    def join(self, host_id: str, round_number: int, store: str, now: float) -> None:
        host = self._known(host_id, now)
        if host is None or not host.group:
            return
        group = self.groups[host.group]
        if round_number > group.current.number:
            self._advance(group, round_number, now, f"host {host_id} joins round {round_number}")
        if (group.current.complete and round_number == group.current.number and host_id in group.current.ranks
                and host.joined_round == round_number and store == host.store):
            # The same join again (its agent's stream was opened again): the round stands; say it again.
            rank = group.current.ranks.index(host_id)
            self._push(host_id, pb.HostPush(complete=pb.RoundComplete(
                round=group.current.number, node_rank=rank, store=group.current.store, hosts=group.current.ranks)))
            return
        if group.current.complete:
            if host_id in group.current.ranks and host.left_round != group.current.number:
                # Its ranks of the running round are gone: that round is over for every host.
                self.hosts[host_id] = host = dataclasses.replace(host, failed_round=group.current.number,
                                                                 failure="it joins the next round")
                self._evaluate(group.replica_id, now)
        number = group.current.number
        self.hosts[host_id] = dataclasses.replace(self.hosts[host_id], joined_round=number, store=store)
        self._push(host_id, pb.HostPush(joined=number))
        self._evaluate(group.replica_id, now)

    def failure(self, host_id: str, round_number: int, reason: str, now: float) -> None:
        host = self._known(host_id, now)
        if host is None or not host.group or round_number != self.groups[host.group].current.number:
            return  # a report about a round already over
        log.warning("job %s: host %s of %s failed in round %d: %s", self.job, host_id, host.group, round_number,
                    reason, extra={"event": "host_failed", "job": self.job, "host": host_id, "group": host.group,
                                   "round": round_number, "reason": reason})
        self.hosts[host_id] = dataclasses.replace(host, failed_round=round_number, failure=reason[:200])
        self._evaluate(host.group, now)

    def leave(self, host_id: str, round_number: int, reason: str, now: float) -> None:
        host = self._known(host_id, now)
        if host is None:
            return
        log.info("job %s: host %s left: %s", self.job, host_id, reason,
                 extra={"event": "host_left", "job": self.job, "host": host_id, "reason": reason})
        if not host.group:
            del self.hosts[host_id]
            return
        self.hosts[host_id] = dataclasses.replace(host, left_round=round_number or -1)
        group = self.groups[host.group]
        if all(h.left_round for h in self.hosts.values() if h.group == group.replica_id):
            for member in [h for h in self.hosts.values() if h.group == group.replica_id]:
                del self.hosts[member.host_id]
            group.reason = f"round {group.current.number}: every host left ({reason})"

    def beat(self, host_id: str, now: float) -> None:
        self._known(host_id, now)

    def closed(self, host_id: str, connection: int, now: float) -> None:
        """The stream of connection ``connection`` ended; a host that did not
        leave is lost from now (a newer connection of the host replaced it: nothing)."""
        link = self._links.get(host_id)
        if link is None or link.connection != connection:
            return
        del self._links[host_id]
        host = self.hosts.get(host_id)
        if host is None:
            return
        if not host.group:
            del self.hosts[host_id]  # a spare that goes is simply not a spare any more
            return
        if host.left_round == 0 and host.lost_since is None:
            self._lose(host, now, "its stream closed")

    def tick(self, now: float, heartbeat_timeout: float) -> None:
        """Hosts silent past ``heartbeat_timeout`` are lost; then every group is decided again."""
        for host_id, link in list(self._links.items()):
            host = self.hosts.get(host_id)
            if host is not None and host.lost_since is None and now - link.last_seen > heartbeat_timeout:
                # Its stream is ended too: if the agent is alive after all, it comes back with a hello and
                # learns where its group is, rather than talking on a stream the table no longer follows.
                del self._links[host_id]
                link.push(None)
                if host.group and host.left_round == 0:
                    self._lose(host, now, f"no heartbeat for {now - link.last_seen:.1f}s")
                elif not host.group:
                    del self.hosts[host_id]
        for name in list(self.groups):
            self._evaluate(name, now)

    def finish(self, why: str) -> None:
        """The job finished: the spares are not needed (their agents end, exit 0)."""
        if self.finished:
            return
        self.finished = why
        for host in [h for h in self.hosts.values() if not h.group]:
            self._push(host.host_id, pb.HostPush(released=why))
            del self.hosts[host.host_id]

    def stale_incarnation(self, replica_id: str, restart_count: int) -> str:
        """Why a rank of incarnation ``restart_count`` of ``replica_id`` may
        not register ('' if it may): its group's round ended since (round r
        runs as restart count r-1). Such a rank outlived its round on a host
        that has not stopped it yet (cut off, slow); it must not take its
        replica's place from the next round's ranks."""
        group = self.groups.get(replica_id)
        if group is None or restart_count >= group.current.number - 1:
            return ""
        return (f"replica {replica_id}: a rank of round {restart_count + 1} (restart count {restart_count}) may not "
                f"register: that round ended, the group is in round {group.current.number}")

    # ----- status ---------------------------------------------------------------------

    def spares(self) -> list[str]:
        return sorted(h.host_id for h in self.hosts.values() if not h.group and h.alive)

    def group_hosts(self, replica_id: str) -> list[Host]:
        return sorted((h for h in self.hosts.values() if h.group == replica_id), key=lambda h: h.host_id)

    # ----- inside ---------------------------------------------------------------------

    def _alive(self, group: str, but: str) -> list[str]:
        return [h.host_id for h in self.hosts.values() if h.group == group and h.alive and h.host_id != but]

    def _known(self, host_id: str, now: float) -> Host | None:
        link = self._links.get(host_id)
        if link is not None:
            link.last_seen = now
        return self.hosts.get(host_id)

    def _lose(self, host: Host, now: float, why: str) -> None:
        log.warning("job %s: host %s of %s lost: %s", self.job, host.host_id, host.group, why,
                    extra={"event": "host_lost", "job": self.job, "host": host.host_id, "group": host.group,
                           "reason": why})
        self.hosts[host.host_id] = dataclasses.replace(host, lost_since=now)
        self._evaluate(host.group, now)

    def _advance(self, group: Group, number: int, now: float, why: str) -> None:
        """A host is ahead of the group's round (a coordinator that restarted
        learns the round from its hosts; a failure report lost on the way):
        the rounds before are over on every host."""
        if group.current.complete:
            for host in self.hosts.values():
                if host.group == group.replica_id and host.alive:
                    self._push(host.host_id, pb.HostPush(ended=pb.RoundEnded(
                        round=group.current.number, reason=f"round {group.current.number} ended: {why}")))
        group.current = Round(number, now)

    def _push(self, host_id: str, message: pb.HostPush) -> None:
        link = self._links.get(host_id)
        if link is not None:
            link.push(message)

    def _evaluate(self, name: str, now: float) -> None:
        """Decide the group's round until nothing changes, applying each decision."""
        group = self.groups.get(name)
        for _ in range(4):  # e.g. ADOPT_SPARES, then the spare's join completes the round later
            if group is None or group.gave_up or not any(h.group == name for h in self.hosts.values()):
                return
            rules = dataclasses.replace(self.rules, rendezvous_timeout=group.rendezvous_timeout)
            decision = decide(name, group.nnodes, group.current, group.previous, self.hosts, now, rules)
            if decision.action in (Action.WAIT, Action.STEADY):
                group.reason = decision.reason
                return
            self._apply(group, decision, now)

    def _apply(self, group: Group, decision: Decision, now: float) -> None:
        log.info("job %s: %s: %s", self.job, group.replica_id, decision.reason,
                 extra={"event": "rendezvous", "job": self.job, "group": group.replica_id,
                        "action": decision.action.value, "round": decision.round.number,
                        "hosts": list(decision.round.ranks), "store": decision.round.store,
                        "adopted": list(decision.adopted),
                        "reason": decision.reason})
        group.reason = decision.reason
        members = [h for h in self.hosts.values() if h.group == group.replica_id]
        if decision.action is Action.COMPLETE:
            group.current = decision.round
            group.previous = decision.round.ranks
            for rank, host_id in enumerate(decision.round.ranks):
                self._push(host_id, pb.HostPush(complete=pb.RoundComplete(
                    round=decision.round.number, node_rank=rank, store=decision.round.store,
                    hosts=decision.round.ranks)))
        elif decision.action is Action.END:
            ended = group.current.number
            group.current = decision.round
            for host in members:
                if not host.alive:  # a lost host's place stays for it (or a spare) in the next round
                    continue
                self._push(host.host_id, pb.HostPush(ended=pb.RoundEnded(round=ended, reason=decision.reason)))
        elif decision.action is Action.ADOPT_SPARES:
            replaced = sorted((h for h in members if h.lost_since is not None
                               and now - h.lost_since >= self.rules.spare_wait), key=lambda h: h.host_id)
            for spare_id, lost in zip(decision.adopted, replaced, strict=False):
                del self.hosts[lost.host_id]
                self.replaced[lost.host_id] = (f"spare {spare_id} took this host's place (node rank of "
                                               f"{group.replica_id}) while it was gone")
                group.previous = tuple(spare_id if h == lost.host_id else h for h in group.previous)
                self.hosts[spare_id] = dataclasses.replace(self.hosts[spare_id], group=group.replica_id)
                self._push(spare_id, pb.HostPush(adopted=pb.SpareAdopted(
                    replica_id=group.replica_id, replica_rank=group.replica_rank, round=group.current.number,
                    num_replicas=group.num_replicas)))
        elif decision.action is Action.GIVE_UP:
            group.gave_up = decision.reason
            for host in members:
                self._push(host.host_id, pb.HostPush(gave_up=decision.reason))
                del self.hosts[host.host_id]
            # The group's round numbers go on if its hosts come back (a requeued job).
            group.current, group.gave_up = Round(group.current.number + 1, now), ""
