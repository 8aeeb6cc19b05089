"""The state of a job's groups of several hosts and how a rendezvous decision is applied to it (issue 39).

``GroupRounds`` holds what the coordinator knows of the hosts and their
groups' rounds, decides a group's round (``rendezvous.decide``, after
``rendezvous.leading_shape`` while the group's --nnodes/--nproc are not
fixed) and applies the decision: the pushes to the hosts concerned, the
group's node ranks (its ``Roster``), the spares it adopts and the hosts they
replace. What the hosts' streams bring (hellos, joins, failures, ticks) is
fthsdp/coordinator/hosts/table.py's ``HostTable``, which is this class and
its one owner: the coordinator's event loop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

from fthsdp.coordinator.hosts.claims import Roster, decided
from fthsdp.coordinator.hosts.rendezvous import (
    Action,
    Decision,
    Host,
    RendezvousRules,
    Round,
    decide,
    leading_shape,
    shape_of,
    shape_refusal,
)
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.coordinator")


Push = Callable[[pb.HostPush | None], None]
"""Sends one message down a host's stream; None ends the stream (the agent opens it again, saying hello)."""


def no_stream(message: pb.HostPush | None) -> None:
    """The push of a host known only from the others' hellos: it has no stream yet."""


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
    roster: Roster = Roster()
    """The hosts by node rank of the last complete round (a spare in a lost host's place), each with its version."""
    fixed_in: int = 0
    """The round whose completion fixed ``nnodes``/``nproc``; 0: none yet (hosts of any shape gather, and
    ``nnodes``/``nproc`` are the leading shape's)."""
    learning_since: float | None = None
    """Set while the group is learned from its hosts' hellos (this coordinator met it running or gathering: it
    restarted): their rounds and node ranks are believed until a heartbeat timeout after."""
    reason: str = ""
    """The last decision's reason, for status."""
    gave_up: str = ""

    @property
    def previous(self) -> tuple[str, ...]:
        """The hosts by node rank of the last complete round ('' where none is known)."""
        return self.roster.hosts


@dataclasses.dataclass
class Link:
    """A host's open stream."""

    push: Push
    connection: int
    """0: a host known only from the others' hellos, whose stream has not opened yet."""
    last_seen: float
    incarnation: str = ""
    """The agent's own id (HostHello.incarnation): only it may say hello as this host while the stream is open."""
    address: str = ""
    since: float = 0.0


class GroupRounds:
    """A job's hosts and groups, and a group's rendezvous decisions applied (HostTable adds the streams' events)."""

    def __init__(self, job: str, rules: RendezvousRules) -> None:
        self.job = job
        self.rules = rules
        self.hosts: dict[str, Host] = {}
        self.groups: dict[str, Group] = {}
        self._links: dict[str, Link] = {}
        self._connections = 0
        self.replaced: dict[str, tuple[str, str, str]] = {}
        """Hosts whose node rank another took while they were gone: host id -> (why, group, who took it). Such a
        host is released when it comes back, as long as the one that took its place is still in the group."""
        self.finished = ""
        """Set (why) once the job finished: spares are released, and spares that come are too."""

    def _drop(self, host_id: str, group: str, by: str, why: str) -> None:
        """``host_id`` lost its node rank to ``by``: it is released (if connected) and forgotten."""
        self.replaced[host_id] = (why, group, by)
        if self.hosts.pop(host_id, None) is None:
            return
        log.warning("job %s: host %s of %s released: %s", self.job, host_id, group, why,
                    extra={"event": "host_released", "job": self.job, "host": host_id, "group": group,
                           "reason": why})
        link = self._links.pop(host_id, None)
        if link is not None:
            link.push(pb.HostPush(released=why))
            link.push(None)

    def _adoption(self, group: Group) -> pb.HostPush:
        return pb.HostPush(adopted=pb.SpareAdopted(
            replica_id=group.replica_id, replica_rank=group.replica_rank, round=group.current.number,
            num_replicas=group.num_replicas, hosts=group.roster.hosts))

    def _by_group(self) -> tuple[dict[str, list[Host]], list[Host]]:
        members: dict[str, list[Host]] = {}
        spares = []
        for h in self.hosts.values():
            if h.group:
                members.setdefault(h.group, []).append(h)
            else:
                spares.append(h)
        return members, spares

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

    def _evaluate(self, name: str, now: float, bucket: list[Host] | None = None,
                  spares: list[Host] | None = None) -> bool:
        """Decide the group's round until nothing changes, applying each
        decision; ``bucket``/``spares``: the group's hosts and the spares, if
        the caller has them. Returns whether anything was applied."""
        group = self.groups.get(name)
        applied = False
        for _ in range(4):  # e.g. ADOPT_SPARES, then the spare's join completes the round later
            if bucket is None or spares is None:
                bucket = [h for h in self.hosts.values() if h.group == name]
                spares = [h for h in self.hosts.values() if not h.group]
            if group is None or group.gave_up or not bucket:
                return applied
            if not group.fixed_in and (shape := leading_shape(bucket, group.current.number)) is not None:
                group.nnodes, group.nproc = shape
            view = {h.host_id: h for h in bucket if group.fixed_in or shape_of(h) == (group.nnodes, group.nproc)}
            view.update((h.host_id, h) for h in spares)
            rules = dataclasses.replace(self.rules, rendezvous_timeout=group.rendezvous_timeout)
            decision = decide(name, group.nnodes, group.current, group.roster.hosts, view, now, rules)
            if decision.action in (Action.WAIT, Action.STEADY):
                group.reason = decision.reason
                return applied
            self._apply(group, decision, now)
            applied, bucket = True, None
        return applied

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
            group.roster = decided(decision.round.ranks, decision.round.number)
            if not group.fixed_in:
                self._fix_shape(group, members, decision.round.number)
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
            self._adopt(group, decision.adopted, members, now)
        elif decision.action is Action.GIVE_UP:
            group.gave_up = decision.reason
            for host in members:
                self._push(host.host_id, pb.HostPush(gave_up=decision.reason))
                del self.hosts[host.host_id]
            # The group's round numbers go on if its hosts come back (a requeued job).
            group.current, group.gave_up = Round(group.current.number + 1, now), ""

    def _adopt(self, group: Group, adopted: Sequence[str], members: Sequence[Host], now: float) -> None:
        """Spares take lost hosts' node ranks: each is told with the group's
        hosts by node rank, and so is every other host of the group (their
        hellos carry it, should the coordinator restart before the round completes)."""
        name = group.replica_id
        replaced = sorted((h for h in members if h.lost_since is not None
                           and now - h.lost_since >= self.rules.spare_wait), key=lambda h: h.host_id)
        for spare_id, lost in zip(adopted, replaced, strict=False):
            del self.hosts[lost.host_id]
            self.replaced[lost.host_id] = (f"spare {spare_id} took this host's place (node rank of {name}) while it "
                                           f"was gone", name, spare_id)
            hosts = tuple(spare_id if h == lost.host_id else h for h in group.roster.hosts)
            versions = tuple((group.current.number, True) if h == lost.host_id else v
                             for h, v in zip(group.roster.hosts, group.roster.versions, strict=True))
            group.roster = Roster(hosts, versions)
            self.hosts[spare_id] = dataclasses.replace(self.hosts[spare_id], group=name)
        for spare_id in adopted:
            self._push(spare_id, self._adoption(group))
        roster = pb.HostPush(roster=pb.GroupRoster(round=group.current.number, hosts=group.roster.hosts))
        for host in members:
            if host.alive and host.host_id not in adopted:
                self._push(host.host_id, roster)

    def _fix_shape(self, group: Group, members: Sequence[Host], number: int) -> None:
        """The group's first complete round fixes its --nnodes/--nproc: hosts
        that said others are refused, each with one line naming both values."""
        group.fixed_in = number
        shape = (group.nnodes, group.nproc)
        for host in members:
            why = shape_refusal(host, shape, number)
            if not why:
                continue
            log.warning("job %s: host %s refused: %s", self.job, host.host_id, why,
                        extra={"event": "host_refused", "job": self.job, "host": host.host_id,
                               "group": group.replica_id, "reason": why})
            del self.hosts[host.host_id]
            link = self._links.pop(host.host_id, None)
            if link is not None:
                link.push(pb.HostPush(refused=why))
                link.push(None)
