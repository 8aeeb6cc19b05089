"""The hosts of one job's replica groups and their rendezvous rounds (issue 39).

Every host of a group of several hosts keeps one ``Host`` stream open
(fthsdp/coordinator/hosts/stream.py); this table is what the coordinator
knows of them, and applies ``rendezvous.decide`` to a group when something
changes it: an event of one of its hosts' streams (a hello, a join, a
failure report, a leave, a stream closed), or a deadline that falls due (a
host silent past the heartbeat timeout, a lost host's spare wait, a
gathering round's rendezvous timeout; fthsdp/coordinator/hosts/deadlines.py).
It completes rounds, ends them on a failure, gives lost hosts' places to
spares, and gives up on rounds that cannot complete, pushing each outcome
to the hosts concerned. A tick with nothing due looks at no host; an event
looks at its group's hosts (and, for a spare that comes, at the groups
that wait for one), whatever the number of other groups (issue 49).

It is not stored: after a coordinator restart the agents reconnect and say
which round they run, with which node rank and store, and the group's hosts
by node rank as they last heard them; the table is rebuilt from that
(``hello``), as torchft's lighthouse rebuilds its quorum from its replicas.
A host named by the others but not back within a heartbeat timeout (after
a takeover's grace: ``hold``) is lost like any host whose heartbeats stopped, and a spare takes its place after
the spare wait. What a hello may claim (its host id, its round, its node
rank) is checked first (fthsdp/coordinator/hosts/claims.py): a refused hello
changes nothing. One owner: the coordinator's event loop calls every
method; the clock is passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fthsdp.coordinator.hosts.claims import (
    Claim,
    Roster,
    claims,
    displaced,
    identity_refusal,
    merge,
    round_refusal,
)
from fthsdp.coordinator.hosts.index import Link, Push, no_stream
from fthsdp.coordinator.hosts.rendezvous import Host, Round, check_join
from fthsdp.coordinator.hosts.rounds import Group, GroupRounds, log
from fthsdp.core.auth import PermissionDenied
from fthsdp.core.errors import OutOfRange
from fthsdp.protos.v1 import coordinator_pb2 as pb

__all__ = ["Group", "HostTable"]


class HostTable(GroupRounds):
    """The job's hosts and rounds, as their streams change them (the state and the decisions: GroupRounds)."""

    # ----- what a host's stream brings ----------------------------------------------

    def hello(self, hello: pb.HostHello, push: Push, now: float) -> int:
        """A host's stream opened; returns the connection's number (for
        ``closed``). Raises JoinRefused (one line) for a host that would form
        its group wrong, PermissionDenied for a host id an open stream of
        another agent holds, OutOfRange for a round the group cannot be in;
        nothing is recorded then."""
        host_id = hello.host_id
        link = self._links.get(host_id)
        if link is not None and link.connection:
            why = identity_refusal(host_id, link.incarnation, hello.incarnation, link.address, now - link.since)
            if why:
                raise PermissionDenied(why)
        old = self.hosts.get(host_id)
        # A spare whose adoption was lost with its stream says hello as a spare: it is its group's all the same.
        readopt = not hello.replica_id and old is not None and old.group in self.groups
        name = old.group if readopt and old is not None else hello.replica_id
        group = self.groups.get(name) if name else None
        mine = [] if readopt else claims(host_id, hello.hosts, hello.hosts_round, hello.round, hello.node_rank)
        released = self._released(host_id, name, group, mine)
        if released:
            push(pb.HostPush(released=released))
            push(None)
            return 0
        host = Host(host_id, name, hello.nnodes, hello.nproc)
        if group is not None:
            ran = group.current.complete and host_id in group.current.ranks
            learning = group.learning_since is not None
            if not readopt and (why := round_refusal(host_id, name, hello.round, group.current.number, ran,
                                                     learning)):
                raise OutOfRange(why)
            members = [h for h in self._members(name) if h.host_id != host_id]
            if learning and mine:
                # Hosts whose node ranks its newer claims take are not the group's any more.
                _, out = merge(group.roster.sized(group.nnodes), mine)
                members = [h for h in members if h.host_id not in {holder for holder, _, _ in out}]
            check_join(host, (group.nnodes, group.nproc), members, group.current, group.fixed_in)
        self.replaced.pop(host_id, None)
        self._connections += 1
        self._link(host_id, Link(push, self._connections, now, hello.incarnation, hello.address, now))
        if name and group is None:
            group = self._new_group(hello, now)
            self._add_group(group)
        if group is not None and hello.round > group.current.number:
            self._advance(group, hello.round, now, f"host {host_id} is in round {hello.round} already")
        if group is not None and group.learning_since is not None and mine:
            self._learn(group, host_id, hello, mine, now)
        self._put(self._returning(group, host, old, hello, now))
        round_now = group.current.number if group is not None else 0
        push(pb.HostPush(welcome=pb.HostWelcome(host_id=host_id, round=round_now)))
        if readopt and group is not None:
            push(self._adoption(group))
        log.info("job %s: host %s connected (%s)", self.job, host_id, f"group {name}" if name else "spare",
                 extra={"event": "host_connected", "job": self.job, "host": host_id, "group": name})
        if name:
            self._evaluate(name, now)
        else:
            # A spare may be what a group waits for: those that do are offered it (with any wait due by now).
            self._decide_due(now, also=list(self._waiting))
        return self._connections

    def join(self, host_id: str, round_number: int, store: str, now: float, pings: str = "",
             pings_cert: bytes = b"") -> None:
        """``pings``, ``pings_cert``: its HostJoin's (where its relay takes its group's ping batches, and the
        certificate it serves them with under TLS). Raises OutOfRange for a round past the group's (or its next, for a
        host of the running round): nothing changes then."""
        host = self._known(host_id, now)
        if host is None or not host.group:
            return
        group = self.groups[host.group]
        if round_number > group.current.number:
            ran = group.current.complete and host_id in group.current.ranks
            why = round_refusal(host_id, group.replica_id, round_number, group.current.number, ran,
                                group.learning_since is not None)
            if why:
                raise OutOfRange(why)
            self._advance(group, round_number, now, f"host {host_id} joins round {round_number}")
        if (group.current.complete and round_number == group.current.number and host_id in group.current.ranks
                and host.joined_round == round_number and host.store in ("", store)):
            # The same join again (its agent's stream was opened again): the round stands; say it again. (No
            # store known: a host this coordinator learned of running the round, from the others' hellos.)
            rank = group.current.ranks.index(host_id)
            self._put(dataclasses.replace(host, store=store, pings=pings, pings_cert=pings_cert))
            self._push(host_id, pb.HostPush(complete=self.completed(group.current, rank)))
            return
        if group.current.complete:
            if host_id in group.current.ranks and host.left_round != group.current.number:
                # Its ranks of the running round are gone: that round is over for every host.
                host = dataclasses.replace(host, failed_round=group.current.number, failure="it joins the next round")
                self._put(host)
                self._evaluate(group.replica_id, now)
        number = group.current.number
        self._put(dataclasses.replace(self.hosts[host_id], joined_round=number, store=store, pings=pings,
                                      pings_cert=pings_cert))
        self._push(host_id, pb.HostPush(joined=number))
        self._evaluate(group.replica_id, now)

    def failure(self, host_id: str, round_number: int, reason: str, now: float) -> None:
        host = self._known(host_id, now)
        if host is None or not host.group or round_number != self.groups[host.group].current.number:
            return  # a report about a round already over
        log.warning("job %s: host %s of %s failed in round %d: %s", self.job, host_id, host.group, round_number,
                    reason, extra={"event": "host_failed", "job": self.job, "host": host_id, "group": host.group,
                                   "round": round_number, "reason": reason})
        self._put(dataclasses.replace(host, failed_round=round_number, failure=reason[:200]))
        self._evaluate(host.group, now)

    def leave(self, host_id: str, round_number: int, reason: str, now: float) -> None:
        host = self._known(host_id, now)
        if host is None:
            return
        log.info("job %s: host %s left: %s", self.job, host_id, reason,
                 extra={"event": "host_left", "job": self.job, "host": host_id, "reason": reason})
        if not host.group:
            self._remove(host_id)
            return
        self._put(dataclasses.replace(host, left_round=round_number or -1))
        group = self.groups[host.group]
        members = self._members(group.replica_id)
        if all(h.left_round for h in members):
            for member in members:
                self._remove(member.host_id)
            group.reason = f"round {group.current.number}: every host left ({reason})"

    def beat(self, host_id: str, now: float, carried: bool = False) -> None:
        """The host is alive: a heartbeat on its stream, or its id in a ping batch (``carried``: its stream
        sends no heartbeats of its own while batches carry it). A batch speaks only for a host whose stream
        is open: one known only from the others' hellos must come back itself."""
        link = self._links.get(host_id)
        if link is None or (carried and not link.connection):
            return
        link.last_seen = now
        self._carry(link, carried)

    def closed(self, host_id: str, connection: int, now: float) -> None:
        """The stream of connection ``connection`` ended; a host that did not
        leave is lost from now (a newer connection of the host replaced it: nothing)."""
        link = self._links.get(host_id)
        if link is None or not connection or link.connection != connection:
            return  # 0: a hello answered with a release, which opened no connection
        self._unlink(host_id)
        host = self.hosts.get(host_id)
        if host is None:
            return
        if not host.group:
            self._remove(host_id)  # a spare that goes is simply not a spare any more
            return
        if host.left_round == 0 and host.lost_since is None:
            self._lose(host, now, "its stream closed")

    def tick(self, now: float, heartbeat_timeout: float) -> None:
        """What fell due by ``now``, and nothing else: hosts silent past
        ``heartbeat_timeout`` are lost, groups learned after a restart are
        the table's to decide alone a heartbeat timeout after, and groups
        whose spare wait or rendezvous timeout came are decided again. The
        timeout may differ from tick to tick (the event loop's lag is in
        it): each deadline is checked with the one given now. While a
        takeover's hold lasts (``hold``), silence waits."""
        if now >= self._held_until:
            while (due := self._silent.pop(now, heartbeat_timeout)) is not None:
                self._silence(due.key, due.since, due.token, now)
            while (due := self._learning.pop(now, heartbeat_timeout)) is not None:
                group = self.groups.get(due.key)
                if group is not None and group.learning_since == due.since:
                    group.learning_since = None  # every host that lives has said hello: the table decides alone
        self._decide_due(now)

    def hold(self, until: float) -> None:
        """A new leader took over: every host's agent lost its streams at once and comes back after its
        jittered back-off, thousands of them to a coordinator that takes them one by one. Until ``until``
        (the replicas' reconnect grace: fthsdp/coordinator/engine/takeover.py) no host is lost for its
        silence, whether it said hello again or is known only from the others' hellos, and no learned
        group is decided alone; a host whose stream closes, or that its group reports failed, is lost at
        once as ever. Without it, hosts still in their back-off a heartbeat timeout after the takeover
        were lost and their healthy groups dropped (benchmarks/README.md, the failover at 4,000 hosts)."""
        self._held_until = max(self._held_until, until)

    def _silence(self, host_id: str, since: float, link: object, now: float) -> None:
        """The stream ``link`` of ``host_id``, last heard at ``since``, is
        past the heartbeat timeout by then (checked with the tick's)."""
        if self._links.get(host_id) is not link or not isinstance(link, Link):
            return  # a newer stream took its place, or it closed: that one is watched on its own
        self.visits += 1
        if link.last_seen != since:
            self._silent.add(link.last_seen, host_id, link)  # heard since: silent from then
            return
        host = self.hosts.get(host_id)
        if host is None:
            if not link.connection:
                self._unlink(host_id)  # known from the others' hellos, then dropped
            return  # (an open stream of no host: a hello, not silence, brings it back)
        if host.lost_since is not None:
            return
        # Its stream is ended too: if the agent is alive after all, it comes back with a hello and
        # learns where its group is, rather than talking on a stream the table no longer follows.
        self._unlink(host_id)
        link.push(None)
        if host.group and host.left_round == 0:
            self._lose(host, now, f"no heartbeat for {now - link.last_seen:.1f}s" if link.connection else
                       f"not back {now - link.last_seen:.1f}s after the others' hellos named it")
        elif not host.group:
            self._remove(host_id)

    def finish(self, why: str) -> None:
        """The job finished: the spares are not needed (their agents end, exit
        0), nor are spares that come later (until ``reopen``)."""
        if self.finished:
            return
        self.finished = why
        for host in self._spare_hosts():
            self._push(host.host_id, pb.HostPush(released=why))
            self._remove(host.host_id)

    def reopen(self) -> None:
        """The job runs again (it was finished): spares that come are taken again."""
        self.finished = ""

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

    # ----- hellos ---------------------------------------------------------------------

    def _released(self, host_id: str, name: str, group: Group | None, mine: Sequence[Claim]) -> str:
        """Why a host saying hello is not needed ('' if it is): the job
        finished (a spare), or another host took its node rank while it was
        gone and still holds it, whoever else is connected at the time."""
        if not name:
            return self.finished
        if group is None or host_id in group.roster.hosts:
            return ""
        if host_id in self.replaced:
            why, where, by = self.replaced[host_id]
            if where == name and self._member(by, name):
                return why
        took = displaced(group.roster, mine, host_id)
        if took is not None and self._member(took[1], name):
            return f"host {took[1]} took this host's node rank {took[0]} of group {name} while it was gone"
        return ""

    def _new_group(self, hello: pb.HostHello, now: float) -> Group:
        # A host that ran a round (or heard of one) fixes the group's shape: that round completed with it.
        ran = hello.hosts_round or (hello.round if hello.node_rank >= 0 else 0)
        return Group(hello.replica_id, hello.replica_rank, hello.num_replicas, hello.nnodes, hello.nproc,
                     hello.rendezvous_timeout or self.rules.rendezvous_timeout, Round(max(hello.round, 1), now),
                     roster=Roster().sized(hello.nnodes) if ran else Roster(), fixed_in=ran,
                     learning_since=now if hello.round > 0 else None)

    def _learn(self, group: Group, host_id: str, hello: pb.HostHello, mine: Sequence[Claim], now: float) -> None:
        """Take a hello's newer node ranks (the group is learned after a
        restart): the hosts they displace are released, and the hosts they
        name that are not back yet are known from now (lost if they do not
        come back within the heartbeat timeout, then replaced by a spare)."""
        name = group.replica_id
        if not group.fixed_in:
            # The first host to say hello had run no round; this one did: that round's shape is the group's.
            group.nnodes, group.nproc = hello.nnodes, hello.nproc
            self._fix_shape(group, self._members(name), max(c.version[0] for c in mine))
        group.roster, out = merge(group.roster.sized(group.nnodes), mine)
        for holder, by, rank in out:
            self._drop(holder, name, by, f"host {by} took this host's node rank {rank} of group {name} while it "
                                         f"was gone")
        # Its roster is of the round it runs: every host of it joined that round.
        running = hello.node_rank >= 0 and hello.hosts_round == hello.round == group.current.number
        for rank, other in enumerate(group.roster.hosts):
            known = self.hosts.get(other)
            if not other or other == host_id or (known is not None and known.group == name):
                continue
            if known is None:
                self._put(Host(other, name, group.nnodes, group.nproc,
                               joined_round=group.current.number if running else 0,
                               store=hello.store if running and rank == 0 else ""))
                self._link(other, Link(no_stream, 0, now))
            elif not known.group:
                # A spare this group adopted before the restart, whose adoption it may not have heard.
                self._put(dataclasses.replace(known, group=name))
                self._push(other, self._adoption(group))

    def _returning(self, group: Group | None, host: Host, old: Host | None, hello: pb.HostHello,
                   now: float) -> Host:
        """What the table records of a host saying hello to ``group``, given what it knew (``old``)."""
        if group is None:
            return host
        current = group.current
        at = current.ranks[hello.node_rank:hello.node_rank + 1] if hello.node_rank >= 0 else ()
        if hello.round == current.number and hello.node_rank >= 0 and (
                group.learning_since is not None or at == (host.host_id,)):
            # Back while running (after a coordinator restart, or its stream dropped): the round goes on as it was.
            store = old.store if old is not None and old.store else hello.store
            return dataclasses.replace(host, joined_round=current.number, store=store)
        if (old is not None and old.group == group.replica_id and current.complete
                and host.host_id in current.ranks and old.left_round != current.number):
            if hello.round == current.number:
                # The same agent, which had joined the round but not heard it complete: it joins again, as it was.
                return dataclasses.replace(host, joined_round=old.joined_round, store=old.store)
            # A host of the running round back with nothing running: its last incarnation died.
            self._put(dataclasses.replace(old, failed_round=current.number,
                                          failure="its agent came back with no ranks running"))
            self._evaluate(group.replica_id, now)
        return host

    def _known(self, host_id: str, now: float) -> Host | None:
        link = self._links.get(host_id)
        if link is not None:
            link.last_seen = now
        return self.hosts.get(host_id)
