"""The state of a job's groups of several hosts and how a rendezvous decision is applied to it (issue 39).

``GroupRounds`` holds what the coordinator knows of the groups' rounds (over
its hosts, indexed by group: fthsdp/coordinator/hosts/index.py), decides a
group's round (``rendezvous.decide``, after ``rendezvous.leading_shape``
while the group's --nnodes/--nproc are not fixed) and applies the decision:
the pushes to the hosts concerned, the group's node ranks (its ``Roster``),
the spares it adopts in the places of the lost hosts the decision names.

A group is decided again when something changes it, never on a sweep over
every group: after each event of its hosts' streams (fthsdp/coordinator/
hosts/table.py's ``HostTable``, which is this class and its one owner: the
coordinator's event loop), and when one of its deadlines falls due
(fthsdp/coordinator/hosts/deadlines.py): a lost host's spare wait, a
gathering round's rendezvous timeout. These are the only ways time alone
changes a decision. A spare that comes is offered to the groups that wait
for one (a lost host past its spare wait, no spare yet), not to every group.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

from fthsdp.coordinator.hosts.claims import Roster, decided
from fthsdp.coordinator.hosts.deadlines import Due
from fthsdp.coordinator.hosts.index import HostIndex
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



class GroupRounds(HostIndex):
    """A job's groups, and a group's rendezvous decisions applied (HostTable adds the streams' events)."""

    def __init__(self, job: str, rules: RendezvousRules) -> None:
        super().__init__()
        self.job = job
        self.rules = rules
        self.groups: dict[str, Group] = {}
        self._order: dict[str, int] = {}
        """Each group's place in the order groups came: groups decided at one time are decided in it."""
        self._connections = 0
        self.replaced: dict[str, tuple[str, str, str]] = {}
        """Hosts whose node rank another took while they were gone: host id -> (why, group, who took it). Such a
        host is released when it comes back, as long as the one that took its place is still in the group."""
        self.finished = ""
        """Set (why) once the job finished: spares are released, and spares that come are too."""
        self._spare_waits = Due(strict=False)
        """Lost hosts by when they were lost: a spare may take the place once ``now - lost_since >= spare_wait``
        (as ``rendezvous.decide`` compares)."""
        self._gathering: dict[float, Due] = {}
        """Gathering rounds by when they opened, one ``Due`` per rendezvous timeout (a group's own, from its
        hellos: the agents' flag, one value in practice; one comparison each per tick while a round of it
        gathers): the round gives up once ``now - opened_at >= rendezvous_timeout``, exactly as decided."""
        self._learning = Due(strict=True)
        """Groups learned from their hosts' hellos by when the first came: done a heartbeat timeout after."""
        self._held_until = float("-inf")
        """After a takeover: no host is judged silent, and no group learned, before then (``hold``)."""
        self._waiting: dict[str, None] = {}
        """Groups with a lost host past its spare wait and no spare yet (as of their last decision): a spare
        that comes is offered to these."""

    def _add_group(self, group: Group) -> None:
        name = group.replica_id
        self.groups[name] = group
        self._order[name] = len(self._order)
        self._open(group, group.current)
        if group.learning_since is not None:
            self._learning.add(group.learning_since, name)

    def _open(self, group: Group, current: Round) -> None:
        """``current`` is the group's round from now; a gathering one may give up at its rendezvous timeout."""
        group.current = current
        if not current.complete:
            due = self._gathering.setdefault(group.rendezvous_timeout, Due(strict=False))
            due.add(current.opened_at, group.replica_id, current.number)

    def _drop(self, host_id: str, group: str, by: str, why: str) -> None:
        """``host_id`` lost its node rank to ``by``: it is released (if connected) and forgotten."""
        self.replaced[host_id] = (why, group, by)
        if self._remove(host_id) is None:
            return
        log.warning("job %s: host %s of %s released: %s", self.job, host_id, group, why,
                    extra={"event": "host_released", "job": self.job, "host": host_id, "group": group,
                           "reason": why})
        link = self._unlink(host_id)
        if link is not None:
            link.push(pb.HostPush(released=why))
            link.push(None)

    def _adoption(self, group: Group) -> pb.HostPush:
        return pb.HostPush(adopted=pb.SpareAdopted(
            replica_id=group.replica_id, replica_rank=group.replica_rank, round=group.current.number,
            num_replicas=group.num_replicas, hosts=group.roster.hosts))

    def _lose(self, host: Host, now: float, why: str) -> None:
        log.warning("job %s: host %s of %s lost: %s", self.job, host.host_id, host.group, why,
                    extra={"event": "host_lost", "job": self.job, "host": host.host_id, "group": host.group,
                           "reason": why})
        self._put(dataclasses.replace(host, lost_since=now))
        self._spare_waits.add(now, host.host_id)
        self._evaluate(host.group, now)

    def _advance(self, group: Group, number: int, now: float, why: str) -> None:
        """A host is ahead of the group's round (a coordinator that restarted
        learns the round from its hosts; a failure report lost on the way):
        the rounds before are over on every host."""
        if group.current.complete:
            for host in self._members(group.replica_id):
                if host.alive:
                    self._push(host.host_id, pb.HostPush(ended=pb.RoundEnded(
                        round=group.current.number, reason=f"round {group.current.number} ended: {why}")))
        self._open(group, Round(number, now))

    # ----- deciding -------------------------------------------------------------------

    def _decide_due(self, now: float, also: Iterable[str] = ()) -> None:
        """Decide again the groups whose spare wait or rendezvous timeout fell
        due, and ``also``; in the order the groups came, as a sweep did."""
        names = dict.fromkeys(also)
        while (due := self._spare_waits.pop(now, self.rules.spare_wait)) is not None:
            host = self.hosts.get(due.key)
            self.visits += 1
            if host is not None and host.group and host.lost_since == due.since:  # else: back, replaced, gone
                names[host.group] = None
        for timeout, gathering in list(self._gathering.items()):
            while (due := gathering.pop(now, timeout)) is not None:
                group = self.groups.get(due.key)
                if group is not None and not group.current.complete and (
                        group.current.number, group.current.opened_at) == (due.token, due.since):
                    names[due.key] = None
            if not gathering:
                del self._gathering[timeout]
        for name in sorted(names, key=self._order.__getitem__):
            self._evaluate(name, now)

    def _evaluate(self, name: str, now: float) -> bool:
        """Decide the group's round until nothing changes, applying each
        decision. Returns whether anything was applied."""
        group = self.groups.get(name)
        applied = False
        for _ in range(4):  # e.g. END, then ADOPT_SPARES; the spare's join completes the round later
            bucket = self._members(name)
            if group is None or group.gave_up or not bucket:
                self._waiting.pop(name, None)
                return applied
            if not group.fixed_in and (shape := leading_shape(bucket, group.current.number)) is not None:
                group.nnodes, group.nproc = shape
            decision, wants_spare = self._decide(group, bucket, now)
            if decision.action in (Action.WAIT, Action.STEADY):
                group.reason = decision.reason
                if wants_spare and not group.current.complete:
                    self._waiting[name] = None
                else:
                    self._waiting.pop(name, None)
                return applied
            self._apply(group, decision, now)
            applied = True
        return applied

    def _decide(self, group: Group, bucket: Sequence[Host], now: float) -> tuple[Decision, bool]:
        """The group's decision over its hosts ``bucket``, and whether a spare
        could be what it waits for: the spares are in the decision only
        then, since it looks at them only to adopt one in the place of a
        lost host past its spare wait (so it costs the group's hosts alone)."""
        view = {h.host_id: h for h in bucket if group.fixed_in or shape_of(h) == (group.nnodes, group.nproc)}
        wants_spare = any(h.lost_since is not None and now - h.lost_since >= self.rules.spare_wait for h in bucket)
        if wants_spare:
            view.update((h.host_id, h) for h in self._spare_hosts())
        rules = dataclasses.replace(self.rules, rendezvous_timeout=group.rendezvous_timeout)
        return decide(group.replica_id, group.nnodes, group.current, group.roster.hosts, view, now, rules), wants_spare

    def reason(self, name: str, now: float) -> str:
        """Why the group's round is where it is, as of ``now``: a gathering
        round's waits count up ("lost 4s ago"), so they are worked out again
        here rather than by deciding every group on every tick; a change a
        deadline brings is shown once it is made."""
        group = self.groups[name]
        bucket = [] if group.current.complete or group.gave_up else self._members(name)
        if not bucket:
            return group.reason
        decision, _ = self._decide(group, bucket, now)
        return decision.reason if decision.action is Action.WAIT else group.reason

    def completed(self, done: Round, rank: int) -> pb.RoundComplete:
        """What the host of node rank ``rank`` is pushed of the complete round ``done``: with where its node
        rank 0 takes the group's ping batches (fthsdp/agent/node/relay/tree.py)."""
        first = self.hosts.get(done.ranks[0])
        complete = pb.RoundComplete(round=done.number, node_rank=rank, store=done.store, hosts=done.ranks)
        if first is not None and first.joined_round == done.number:
            complete.pings, complete.pings_cert = first.pings, first.pings_cert
        return complete

    def _apply(self, group: Group, decision: Decision, now: float) -> None:
        log.info("job %s: %s: %s", self.job, group.replica_id, decision.reason,
                 extra={"event": "rendezvous", "job": self.job, "group": group.replica_id,
                        "action": decision.action.value, "round": decision.round.number,
                        "hosts": list(decision.round.ranks), "store": decision.round.store,
                        "adopted": list(decision.adopted),
                        "reason": decision.reason})
        group.reason = decision.reason
        members = self._members(group.replica_id)
        if decision.action is Action.COMPLETE:
            self._open(group, decision.round)
            group.roster = decided(decision.round.ranks, decision.round.number)
            if not group.fixed_in:
                self._fix_shape(group, members, decision.round.number)
            for rank, host_id in enumerate(decision.round.ranks):
                self._push(host_id, pb.HostPush(complete=self.completed(decision.round, rank)))
        elif decision.action is Action.END:
            ended = group.current.number
            self._open(group, decision.round)
            for host in members:
                if not host.alive:  # a lost host's place stays for it (or a spare) in the next round
                    continue
                self._push(host.host_id, pb.HostPush(ended=pb.RoundEnded(round=ended, reason=decision.reason)))
        elif decision.action is Action.ADOPT_SPARES:
            self._adopt(group, decision, members)
        elif decision.action is Action.GIVE_UP:
            group.gave_up = decision.reason
            for host in members:
                self._push(host.host_id, pb.HostPush(gave_up=decision.reason))
                self._remove(host.host_id)
            # The group's round numbers go on if its hosts come back (a requeued job).
            self._open(group, Round(group.current.number + 1, now))
            group.gave_up = ""

    def _adopt(self, group: Group, decision: Decision, members: Sequence[Host]) -> None:
        """Spares take the node ranks of the lost hosts the decision pairs
        them with: each is told with the group's hosts by node rank, and so
        is every other host of the group (their hellos carry it, should the
        coordinator restart before the round completes)."""
        name = group.replica_id
        for spare_id, lost_id in zip(decision.adopted, decision.replaced, strict=True):
            self._remove(lost_id)
            self.replaced[lost_id] = (f"spare {spare_id} took this host's place (node rank of {name}) while it "
                                      f"was gone", name, spare_id)
            hosts = tuple(spare_id if h == lost_id else h for h in group.roster.hosts)
            versions = tuple((group.current.number, True) if h == lost_id else v
                             for h, v in zip(group.roster.hosts, group.roster.versions, strict=True))
            group.roster = Roster(hosts, versions)
            self._put(dataclasses.replace(self.hosts[spare_id], group=name))
        for spare_id in decision.adopted:
            self._push(spare_id, self._adoption(group))
        roster = pb.HostPush(roster=pb.GroupRoster(round=group.current.number, hosts=group.roster.hosts))
        for host in members:
            if host.alive and host.host_id not in decision.adopted:
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
            self._remove(host.host_id)
            link = self._unlink(host.host_id)
            if link is not None:
                link.push(pb.HostPush(refused=why))
                link.push(None)
