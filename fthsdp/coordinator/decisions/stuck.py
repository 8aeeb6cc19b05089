"""A stuck collective is resolved, never timed out by everyone.

When every member of a quorum waits in the same collective and nobody can
be blamed (fthsdp/coordinator/decisions/hang.py ``find_stuck``), what fails is between the
members: a connection reset, a data link down or flapping, a cut between
two of them. Every process is alive and heartbeats over the control path,
so no liveness rule fires, and left alone every member would end with
``FtarTimeout`` and the state be lost. The coordinator acts first, in two
stages:

1. Regroup. The same members form a new quorum, so a new group with new
   connections; the members leave the stuck collective at once and redo the
   step from their intact gradients. That mends a transient fault.
2. Probe. If the regrouped collective is stuck too, the members probe each
   other over the data path (a TCP connect to the address its collectives
   use, fthsdp/agent/training/session/reach_probe.py) and report what they
   reached. Up to ``PROBE_ALL_UP_TO`` members every member probes every
   other; above, each probes its neighbours on a ring (``probe_targets``:
   at most 8, so the probes and their answers grow with the members, not
   with their square, and each member is sent only its own targets). The
   coordinator keeps the largest set of members with no cut between them
   reported (``largest_clique``; a pair nobody probed counts as linked) and
   takes out the rest, each "unreachable from" the ones it could not
   reach. A cut that the ring's pairs miss leaves the collective stuck: the
   next round, in the smaller quorum, probes other pairs. If every member reaches every other, the
   collective is slow, not cut: nobody is taken out (a degraded link that
   still moves is the straggler policy's business), and the cycle starts
   again after another limit.

A replica taken out this way stays marked unreachable (kept across its
restarts): it is neither admitted nor given a catch-up source, and waits,
probing the members whenever asked, until it reaches them all again
(``reaches_all``).

Everything here is pure, with the clock passed in (tests/test_stuck.py is
table-driven); fthsdp/coordinator/job/member_checks.py applies the actions to the job.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence

from fthsdp.coordinator.decisions.hang import Stuck

PROBE_WAIT = 5.0
"""How long the coordinator waits for every member's probe report before it
decides with the ones it has: a probe of a cut peer ends at its connect
timeout (fthsdp/agent/training/session/reach_probe.py), well within."""

REPROBE_EVERY = 3.0
"""How often a replica marked unreachable is asked to probe the members again."""


class Stage(str, enum.Enum):
    WATCHING = "watching"
    """Nothing stuck, or a new incident not acted on yet."""
    REGROUPED = "regrouped"
    """A regroup was asked for the collective stuck at ``step``."""
    PROBING = "probing"
    """The regrouped collective was stuck too: the members probe each other."""
    SLOW = "slow"
    """Every member reached every other: the collective is slow, not cut."""


class Act(str, enum.Enum):
    NOTHING = "nothing"
    REGROUP = "regroup"
    PROBE = "probe"
    TAKE_OUT = "take-out"
    KEEP = "keep"
    """The probes found no cut: nobody is taken out (``Remedy.reason`` says so)."""


@dataclasses.dataclass(frozen=True)
class Escalation:
    stage: Stage = Stage.WATCHING
    step: int = -1
    """The step the collective is stuck at."""
    quorum_id: int = 0
    """The quorum the last action was taken in."""
    probe_id: int = 0
    """The members' probe under way (its id is set by fthsdp/coordinator/decisions/reach_book.py)."""
    since: float = 0.0
    """When the stage began."""


@dataclasses.dataclass(frozen=True)
class Remedy:
    act: Act
    reason: str = ""
    take_out: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Members to take out, with why (``Act.TAKE_OUT``)."""


NOTHING = Remedy(Act.NOTHING)


def escalate(
    esc: Escalation,
    stuck: Stuck | None,
    members: Sequence[str],
    quorum_id: int,
    low_step: int,
    reach: Mapping[str, Mapping[str, bool]],
    reported: frozenset[str],
    now: float,
    limit: float,
) -> tuple[Escalation, Remedy]:
    """The next stage and what to do.

    ``stuck``: the verdict of ``find_stuck`` on the current quorum (its waits
    count from the quorum's start); ``low_step``: the lowest step among the
    members' latest reports (past ``esc.step``: the collective finished);
    ``reach``/``reported``: the answers to probe ``esc.probe_id`` so far
    (``merge_reports``) and the members that answered with every rank.
    """
    if esc.stage is not Stage.WATCHING and low_step > esc.step:
        esc = dataclasses.replace(esc, stage=Stage.WATCHING)  # it moved on: a later stall is a new incident
    n = len(members)
    if esc.stage is Stage.WATCHING or (esc.stage is Stage.SLOW and now - esc.since >= limit):
        if stuck is None:
            return esc, NOTHING
        why = stuck.reason(n, limit)
        return (Escalation(Stage.REGROUPED, stuck.step, quorum_id, esc.probe_id, now),
                Remedy(Act.REGROUP, f"{why}; regrouping them in a new group"))
    if esc.stage is Stage.REGROUPED:
        if quorum_id == esc.quorum_id or stuck is None:
            return esc, NOTHING  # the regroup is not in place yet, or its collective has not waited the limit
        why = stuck.reason(n, limit)
        return (Escalation(Stage.PROBING, esc.step, quorum_id, esc.probe_id + 1, now),
                Remedy(Act.PROBE, f"{why}, after a regroup; the members probe each other over the data path"))
    if esc.stage is Stage.PROBING:
        if quorum_id != esc.quorum_id:
            return Escalation(Stage.WATCHING, probe_id=esc.probe_id), NOTHING  # the quorum changed anyway
        if not reported.issuperset(members) and now - esc.since < PROBE_WAIT:
            return esc, NOTHING
        missing = sorted(set(members) - reported)
        unheard = f" ({', '.join(missing)} did not answer)" if missing else ""
        keep = largest_clique(members, reach)
        if len(keep) == n:
            return (dataclasses.replace(esc, stage=Stage.SLOW, since=now),
                    Remedy(Act.KEEP, f"every member reaches every other over the data path{unheard}: the collective "
                                     f"of step {esc.step} is slow, not cut; nobody is taken out"))
        kept = set(keep)
        out = {rid: f"unreachable from {', '.join(k for k in keep if not _linked(rid, k, reach))}"
                    f" over the data path (probe {esc.probe_id}, step {esc.step})"
               for rid in members if rid not in kept}
        return (Escalation(Stage.WATCHING, probe_id=esc.probe_id),
                Remedy(Act.TAKE_OUT, f"keeping {', '.join(keep)}, which all reach one another{unheard}", out))
    return esc, NOTHING


PROBE_ALL_UP_TO = 16
"""Members up to which every member probes every other (120 pairs at 16)."""


def probe_targets(members: Sequence[str], replica_id: str) -> tuple[str, ...]:
    """Whom ``replica_id`` probes, sorted: every member (itself included; a
    prober skips its own id) up to ``PROBE_ALL_UP_TO``; above, its neighbours
    on the ring of the sorted members at offsets 1, 2, about the square root
    of their number, and half of it, both ways. One failed node is then
    reported by each of its neighbours; a cut between two parts of the job
    (two racks, two halves) crosses the long offsets, which join members far
    apart in the order."""
    ids = sorted(members)
    n = len(ids)
    if n <= PROBE_ALL_UP_TO or replica_id not in ids:
        return tuple(ids)
    i = bisect.bisect_left(ids, replica_id)
    offsets = {1, 2, math.isqrt(n - 1) + 1, n // 2}
    return tuple(sorted({ids[(i + sign * o) % n] for o in offsets for sign in (1, -1)} - {replica_id}))


def merge_reports(
    ranks: Mapping[str, Mapping[int, tuple[frozenset[str], frozenset[str]]]], world_sizes: Mapping[str, int],
) -> tuple[dict[str, dict[str, bool]], frozenset[str]]:
    """Per replica, whom it reached: a replica reaches a peer when none of
    its ranks failed to reach that peer's rank (each rank probes its own
    rank of every peer: the collectives of rank k run among rank-k
    processes). ``ranks``: replica -> rank -> (reached, unreached).
    Returns the merged table and the replicas every rank of which answered."""
    table: dict[str, dict[str, bool]] = {}
    complete = []
    for rid, by_rank in ranks.items():
        row = table.setdefault(rid, {})
        for reached, unreached in by_rank.values():
            for peer in reached:
                row.setdefault(peer, True)
            for peer in unreached:
                row[peer] = False
        if len(by_rank) >= world_sizes.get(rid, 1):
            complete.append(rid)
    return table, frozenset(complete)


def _linked(a: str, b: str, reach: Mapping[str, Mapping[str, bool]]) -> bool:
    """No side reported the pair cut (a member that did not answer is no evidence)."""
    return reach.get(a, {}).get(b, True) and reach.get(b, {}).get(a, True)


EXACT_UP_TO = 24
"""Members up to which the largest clique is found exactly (Bron-Kerbosch);
above, greedily: a cut is usually one node or a few links, which greedy finds."""


def largest_clique(members: Sequence[str], reach: Mapping[str, Mapping[str, bool]]) -> list[str]:
    """The largest set of members that all reach one another, sorted; among
    sets of that size the one with the lowest ids (a deterministic pick)."""
    ids = sorted(members)
    adj = {a: {b for b in ids if b != a and _linked(a, b, reach)} for a in ids}
    if len(ids) > EXACT_UP_TO:
        return _greedy(ids, adj)
    best: list[str] = []

    def expand(chosen: list[str], candidates: set[str], excluded: set[str]) -> None:
        nonlocal best
        if not candidates and not excluded:
            found = sorted(chosen)
            if len(found) > len(best) or (len(found) == len(best) and found < best):
                best = found
            return
        if len(chosen) + len(candidates) < len(best):
            return
        pivot = max(candidates | excluded, key=lambda v: len(adj[v] & candidates))
        for v in sorted(candidates - adj[pivot]):
            expand(chosen + [v], candidates & adj[v], excluded & adj[v])
            candidates = candidates - {v}
            excluded = excluded | {v}

    expand([], set(ids), set())
    return best


def _greedy(ids: list[str], adj: dict[str, set[str]]) -> list[str]:
    """Drop the member with the most missing links (the highest id on a tie) until all are linked."""
    left = set(ids)
    while True:
        missing = {v: len(left - adj[v] - {v}) for v in left}
        worst = max(left, key=lambda v: (missing[v], v))
        if missing[worst] == 0:
            return sorted(left)
        left.discard(worst)


def reaches_all(reach_row: Mapping[str, bool], members: Sequence[str], heard: bool) -> bool:
    """Whether a replica marked unreachable reached every member in its
    latest answer (``heard``: every one of its ranks answered)."""
    return heard and bool(members) and all(reach_row.get(m) is True for m in members)
