"""The rendezvous of one replica group's hosts, as a pure function (issue 39).

A replica group of N hosts runs ``fthsdp agent --replica-id R --nnodes N``
on every host. Each agent *joins* the group's current round with the address
of a store it has just opened on a free port; the coordinator decides, from
what it knows of the hosts and the clock, what the round does next:

* **Gathering.** The round completes once N live hosts of the group have
  joined it: the node ranks are handed out (a host keeps the rank it had in
  the round before where it can, the others take the lowest free ranks, in
  host-id order), and the store of the host given rank 0 is the group's
  store for this round. The round's number is the group's incarnation:
  every host uses it as its restart count, so a rank of an earlier round
  can never reach a later round's store.
* **A host that does not come.** A host of the group's last round that is
  lost (its agent's heartbeats stopped) for ``spare_wait`` gives its place
  to a spare host (``fthsdp agent --spare``) that fits (the same
  ``--nproc``); with no spare the round waits, and after
  ``rendezvous_timeout`` since it opened its agents give up, with the reason.
* **Running.** One failure of any host of the round (a rank that exits, a
  hang, an agent that reports a failure, a host whose heartbeats stop) ends
  the round for every host at once; the next round opens.

``decide`` returns what to do and why; the coordinator is to apply it
and push it to the group's agents. A group's ``--nnodes``/``--nproc`` are
those of its first complete round (``leading_shape`` picks the shape to
decide with until then); ``check_join`` refuses, with one line, a join that
would form a group wrong (another shape, once fixed, names both values).

The coordinator applies it in fthsdp/coordinator/hosts/rounds.py; the
decision is tested table-driven (tests/test_rendezvous.py).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from fthsdp.core.errors import FthsdpError


class JoinRefused(FthsdpError):
    """A host's join would form its group wrong: nothing is recorded."""


@dataclasses.dataclass(frozen=True)
class RendezvousRules:
    spare_wait: float = 10.0
    """How long a lost host's node rank waits for it before a spare takes it (the host may come back first)."""
    rendezvous_timeout: float = 600.0
    """How long a round may gather before its agents give up, saying why."""


@dataclasses.dataclass(frozen=True)
class Host:
    """What the coordinator knows of one host's agent."""

    host_id: str
    """The agent's own name for its host, unique in the job."""
    group: str
    """The replica group it serves; '' for a spare that none has taken."""
    nnodes: int
    nproc: int
    joined_round: int = 0
    """The round it joined last (0: none)."""
    store: str = ""
    """HOST:PORT of the store it opened when it joined that round."""
    pings: str = ""
    """HOST:PORT where its relay takes its group's ping batches (HostJoin.pings, of its last join; '': none)."""
    pings_cert: bytes = b""
    """The certificate its relay serves them with under TLS (HostJoin.pings_cert; empty: plain gRPC)."""
    lost_since: float | None = None
    """When its heartbeats stopped; None while it is alive."""
    failed_round: int = 0
    """The round in which it reported a failure (a rank died, a hang); 0: none."""
    failure: str = ""
    """What it reported: the round's end says it (a host whose rank the coordinator took out may report first, when
    the cause is another host that went silent)."""
    left_round: int = 0
    """The round it left for good in (its ranks finished or drained): not a failure; 0: none."""

    @property
    def alive(self) -> bool:
        return self.lost_since is None


@dataclasses.dataclass(frozen=True)
class Round:
    """One incarnation of a replica group."""

    number: int
    opened_at: float
    ranks: tuple[str, ...] = ()
    """The hosts by node rank once the round completed; () while it gathers."""
    store: str = ""
    """The store of the host of node rank 0, once the round completed."""

    @property
    def complete(self) -> bool:
        return bool(self.ranks)


class Action(enum.Enum):
    WAIT = "wait"
    """The round gathers: nothing changes yet."""
    COMPLETE = "complete"
    """The round is complete: push its ranks and store to its hosts."""
    ADOPT_SPARES = "adopt-spares"
    """Spares take the places of lost hosts; they join the round."""
    END = "end"
    """The round is over on every host: stop its ranks, open the next."""
    GIVE_UP = "give-up"
    """The round could not complete in ``rendezvous_timeout``: its agents end, saying why."""
    STEADY = "steady"
    """The round runs, nothing to do."""


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    round: Round
    """The round after the decision (the next one for END)."""
    adopted: tuple[str, ...] = ()
    """The spares given to the group (ADOPT_SPARES)."""
    replaced: tuple[str, ...] = ()
    """The lost hosts whose node ranks they take, in the same order: ``adopted[i]`` takes ``replaced[i]``'s
    (ADOPT_SPARES). The coordinator applies these pairs as they are: this is the one place that pairs them."""


def decide(group: str, nnodes: int, current: Round, previous: Sequence[str], hosts: Mapping[str, Host],
           now: float, rules: RendezvousRules) -> Decision:
    """What the round ``current`` of ``group`` does next. ``previous``: the
    hosts by node rank of the group's last complete round (() for none)."""
    members = {h.host_id: h for h in hosts.values() if h.group == group}
    if current.complete:
        return _running(current, members, now)
    joined = sorted(i for i, h in members.items() if h.alive and h.joined_round == current.number)
    if len(joined) >= nnodes:
        # More than enough (a host came back beside the one that took its place): the hosts of the last
        # round first, so that one never loses its rank to a newcomer.
        chosen = sorted(joined, key=lambda h: h not in previous)[:nnodes]
        ranks = assign_ranks(chosen, previous, nnodes)
        done = dataclasses.replace(current, ranks=ranks, store=members[ranks[0]].store)
        return Decision(Action.COMPLETE, f"round {current.number} complete: " + ", ".join(
            f"node rank {r} {h}" for r, h in enumerate(ranks)) + f"; the store at {done.store}", done)
    lost = sorted((h for h in members.values() if not h.alive), key=lambda h: h.host_id)
    expired = [h for h in lost if h.lost_since is not None and now - h.lost_since >= rules.spare_wait]
    missing = nnodes - len([h for h in members.values() if h.alive])
    if expired and missing > 0:
        nproc = expired[0].nproc
        fits = sorted(h.host_id for h in hosts.values()
                      if h.group == "" and h.alive and h.nproc == nproc and h.nnodes == nnodes)
        if fits:
            # One spare per lost host past its wait, both in host-id order; a place not known to be a lost host's
            # (a host never seen, one lost within the wait) is no spare's yet.
            count = min(missing, len(expired), len(fits))
            taken, replaced = tuple(fits[:count]), tuple(h.host_id for h in expired[:count])
            return Decision(Action.ADOPT_SPARES, f"round {current.number}: spare {', '.join(taken)} takes the place "
                            f"of lost {', '.join(replaced)}", current, taken, replaced)
    waiting = _waiting_for(current, joined, members, previous, nnodes, now, rules)
    if now - current.opened_at >= rules.rendezvous_timeout:
        return Decision(Action.GIVE_UP, f"round {current.number} did not complete in {rules.rendezvous_timeout:g}s: "
                        f"{waiting}", current)
    return Decision(Action.WAIT, f"round {current.number}: {len(joined)} of {nnodes} hosts joined; {waiting}",
                    current)


def _running(current: Round, members: Mapping[str, Host], now: float) -> Decision:
    for rank, host_id in enumerate(current.ranks):
        host = members.get(host_id)
        if host is not None and host.left_round == current.number:
            continue  # finished or drained: the others finish too, nothing to restart
        why = ("it left the group" if host is None
               else f"host lost {now - host.lost_since:.0f}s ago" if host.lost_since is not None
               else f"it reported a failure{f' ({host.failure})' if host.failure else ''}"
               if host.failed_round == current.number else "")
        if why:
            following = Round(current.number + 1, now)
            return Decision(Action.END, f"round {current.number} ended: node rank {rank} ({host_id}): {why}; "
                            f"round {following.number} gathers", following)
    return Decision(Action.STEADY, f"round {current.number} runs", current)


def _waiting_for(current: Round, joined: Sequence[str], members: Mapping[str, Host], previous: Sequence[str],
                 nnodes: int, now: float, rules: RendezvousRules) -> str:
    """Who the gathering round waits for, in words."""
    parts = []
    for host_id in sorted(i for i in members if i not in joined):
        host = members[host_id]
        rank = f"node rank {previous.index(host_id)}: " if host_id in previous else ""
        if host.lost_since is None:
            parts.append(f"{rank}host {host_id} not joined yet")
        else:
            left = rules.spare_wait - (now - host.lost_since)
            spare = f"a spare takes its place in {left:.0f}s" if left > 0 else "no spare"
            parts.append(f"{rank}host {host_id} lost {now - host.lost_since:.0f}s ago, {spare}")
    unknown = nnodes - len(members)
    if unknown > 0:
        parts.append(f"{unknown} more host{'s' if unknown > 1 else ''} (none known)")
    return "waiting for " + "; ".join(parts) if parts else "waiting"


def assign_ranks(joined: Sequence[str], previous: Sequence[str], nnodes: int) -> tuple[str, ...]:
    """Node ranks for the ``joined`` hosts: each keeps its rank of the round
    before where it had one, the others take the lowest free ranks in
    host-id order (so that a spare takes a lost host's rank)."""
    ranks: list[str | None] = [None] * nnodes
    placed = set()
    for rank, host_id in enumerate(previous[:nnodes]):
        if host_id in joined:
            ranks[rank] = host_id
            placed.add(host_id)
    rest = iter(sorted(h for h in joined if h not in placed))
    out = [r if r is not None else next(rest) for r in ranks]
    return tuple(out)


Shape = tuple[int, int]
"""A group's (--nnodes, --nproc)."""


def shape_of(host: Host) -> Shape:
    return host.nnodes, host.nproc


def leading_shape(members: Sequence[Host], round_number: int) -> Shape | None:
    """The shape a group whose first round has not completed is decided
    with (None: no live host): the one whose live hosts that joined
    ``round_number`` fill it (the round completes with it, which fixes the
    group's shape), else the one most of its live hosts said, the lowest
    host id's on a tie. Until then hosts that disagree gather side by side:
    the first host's flags are not the group's for good."""
    alive = sorted((h for h in members if h.alive), key=lambda h: h.host_id)
    counts: dict[Shape, int] = {}
    for h in alive:
        if h.joined_round == round_number:
            counts[shape_of(h)] = counts.get(shape_of(h), 0) + 1
    for shape, joined in counts.items():
        if joined >= shape[0]:
            return shape
    said: dict[Shape, int] = {}
    for h in alive:
        said[shape_of(h)] = said.get(shape_of(h), 0) + 1
    return max(said, key=lambda s: said[s]) if said else None  # max keeps the first of equals: lowest host id


def shape_refusal(host: Host, shape: Shape, fixed_in: int) -> str:
    """Why ``host`` does not fit its group of ``shape``, fixed when round
    ``fixed_in`` completed ('' if it fits): one line naming both values."""
    parts = [f"--{flag} {mine}, but group {host.group} runs with --{flag} {theirs}"
             for flag, mine, theirs in (("nnodes", host.nnodes, shape[0]), ("nproc", host.nproc, shape[1]))
             if mine != theirs]
    if not parts:
        return ""
    return (f"host {host.host_id}: {'; '.join(parts)} (since its round {fixed_in} completed): give every host of "
            f"a group the same --nnodes and --nproc")


def check_join(host: Host, shape: Shape | None, members: Sequence[Host], current: Round, fixed_in: int = 0) -> None:
    """Refuse a join that would form ``host``'s group wrong (JoinRefused,
    one line). ``shape``: the group's, fixed when round ``fixed_in``
    completed (0: not fixed yet: any shape may gather, and the first to
    complete a round is the group's); ``members``: the group's other hosts."""
    if shape is not None and fixed_in and (why := shape_refusal(host, shape, fixed_in)):
        raise JoinRefused(why)
    others = sorted(h.host_id for h in members
                    if h.host_id != host.host_id and h.alive and shape_of(h) == shape_of(host))
    if len(others) >= host.nnodes and host.host_id not in current.ranks:
        raise JoinRefused(f"host {host.host_id}: group {host.group} already has its {host.nnodes} hosts "
                          f"({', '.join(others)})")
