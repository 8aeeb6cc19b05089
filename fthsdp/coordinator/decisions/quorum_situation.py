"""What the quorum rules read: the replicas sorted once per decision (rule 1, and rule 8's holders).

``classify`` judges every replica alive or lost at ``now`` (rule 1,
fthsdp/coordinator/decisions/liveness.py), then sorts the live ones the way
the rules talk about them: the members that continue and those that stay,
the members leaving (and why), the holders of the committed state (rule 8),
the head step, the outsiders ready to join and those still pending (rule 6).
The result, a ``Situation``, is all that the rules
(fthsdp/coordinator/decisions/quorum_rules.py) read: each rule is a small
function of it, and a table test builds one from made-up views
(tests/test_quorum_rules.py). Lists keep a stable order, for the reasons;
sets answer "in" (10,000 replicas).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from fthsdp.coordinator.decisions.liveness import Awaited
from fthsdp.coordinator.decisions.quorum_types import Outage, Quorum, ReplicaView, Restoring, Rules


def holds_state(r: ReplicaView, committed_step: int) -> bool:
    """Whether a replica holds the job's committed state: its step reached
    ``committed_step`` and it is not halfway through a catch-up (its step
    may come from a replay onto a snapshot it does not have yet) or
    diverged."""
    return r.step >= committed_step and (not r.catching_up or r.ready_since is not None) and not r.diverged


@dataclasses.dataclass(frozen=True)
class Situation:
    """The inputs of one decision, and the replicas sorted for its rules."""

    prev: Quorum | None
    replicas: Mapping[str, ReplicaView]
    now: float
    rules: Rules
    prev_catch_up: Mapping[str, str]
    committed_step: int
    regroup: str
    restoring: Restoring | None
    awaited: Awaited
    """After a coordinator (re)start: the members not back yet (rule 1)."""
    alive: Mapping[str, ReplicaView]
    """Every replica not lost at ``now`` (rule 1)."""
    gone: frozenset[str]
    """Members presumed to have lost the state with a restore (rule 9): not
    back since the coordinator started, while a restore is under way."""
    prev_ids: frozenset[str]
    continuing: Sequence[str]
    """Members of ``prev`` alive and still holding their state (not
    restarted, diverged or ``gone``)."""
    staying: Sequence[str]
    """Those of ``continuing`` not draining nor unreachable: members of the next quorum."""
    leaving: Sequence[str]
    """Members of ``prev`` not staying (rule 3)."""
    why: Mapping[str, str]
    """Why each of ``leaving`` leaves, for the reason."""
    silent: Mapping[str, float]
    """When each of ``leaving`` that went silent (rather than failed,
    drained or restarted) did (rule 4)."""
    outage: Outage | None
    """The split-brain guard's wait for ``prev``'s members, if one is under way (rule 4)."""
    guarded: bool
    """No member carries the committed state on: only holders may (rule 8)."""
    ended: bool
    """Every member left on purpose: the state ended with them (rule 8)."""
    holders: Sequence[str]
    """While ``guarded``: the live replicas that hold the state (``holds_state``)."""
    head: int
    """The step the quorum trains from: the members', or the holders'."""
    eligible: Sequence[str]
    """Outsiders that may join: alive, not draining, cordoned, diverged or unreachable, heartbeating."""
    by_step: bool
    """Whether an outsider's step vouches for it (rule 6): no member trains on past it."""
    ready: Sequence[str]
    """Of ``eligible``, those up to date or caught up (rule 6)."""
    pending: Sequence[str]
    """Of ``eligible``, those not ready yet."""


def classify(
    prev: Quorum | None,
    replicas: Mapping[str, ReplicaView],
    now: float,
    rules: Rules,
    prev_catch_up: Mapping[str, str] | None = None,
    committed_step: int = 0,
    regroup: str = "",
    restoring: Restoring | None = None,
    outage: Outage | None = None,
) -> Situation:
    """Sort the replicas for the rules (the arguments are ``decide``'s)."""
    # After a coordinator (re)start, members not yet back are judged only
    # once every other member is (lost_at).
    awaited = Awaited.of(prev, replicas)
    alive = {i: r for i, r in replicas.items() if awaited.lost_at(i, r, now, rules) is None}
    # While a restore is under way no member holds the state: one a restarted
    # coordinator has not heard from since is presumed lost with it (rule 9), not training on.
    gone = awaited.ids if restoring is not None else frozenset()
    prev_ids = frozenset(prev.member_ids) if prev else frozenset()
    # A member that registered again as a new incarnation lost its state: it
    # leaves the quorum and comes back as a joiner.
    continuing = sorted(i for i in prev_ids
                        if i in alive and not (alive[i].restarted or alive[i].diverged or i in gone))
    staying = [i for i in continuing if not (alive[i].drain_requested or alive[i].unreachable)]
    leaving = sorted(prev_ids - set(staying))
    why, silent = _departures(leaving, replicas, awaited, gone, now, rules)
    guarded, ended, holders, head = _committed_state(prev, prev_ids, replicas, alive, continuing, gone,
                                                     committed_step)
    eligible, by_step, ready, pending = _outsiders(prev, alive, awaited, continuing, guarded, ended, head,
                                                   committed_step)
    if outage is not None and (prev is None or outage.quorum_id != prev.id):
        outage = None  # another quorum's: its wait ended with it
    return Situation(prev, replicas, now, rules, prev_catch_up or {}, committed_step, regroup, restoring,
                     awaited, alive, gone, prev_ids, continuing, staying, leaving, why, silent, outage,
                     guarded, ended, holders, head, eligible, by_step, ready, pending)


def _departures(leaving: Sequence[str], replicas: Mapping[str, ReplicaView], awaited: Awaited,
                gone: frozenset[str], now: float, rules: Rules) -> tuple[dict[str, str], dict[str, float]]:
    """Why each leaving member leaves, and when those that went silent did."""
    why = {}
    silent = {}
    for i in leaving:
        r = replicas.get(i)
        loss = awaited.lost_at(i, r, now, rules) if r is not None else (now, "left", True)
        if loss is None:
            assert r is not None  # a replica without a view is lost ("left"), never None
            why[i] = ("restarted" if r.restarted else "not back, its state lost" if i in gone
                      else "checksum mismatch" if r.diverged
                      else r.unreachable if r.unreachable else "draining")
            continue
        why[i] = loss[1]
        if not loss[2]:
            silent[i] = loss[0]
    return why, silent


def _committed_state(prev: Quorum | None, prev_ids: frozenset[str], replicas: Mapping[str, ReplicaView],
                     alive: Mapping[str, ReplicaView], continuing: Sequence[str], gone: frozenset[str],
                     committed_step: int) -> tuple[bool, bool, list[str], int]:
    """Rule 8: whether only holders may form the quorum (``guarded``),
    whether the members ended the state on purpose, the holders, and the
    head step."""
    # No member carries the state on: only replicas that hold it may,
    # unless every member left on purpose (a Leave that was no failure: the
    # job finished, or was drained), which ends the state rather than loses it.
    guarded = committed_step > 0 and not continuing
    ended = guarded and prev is not None and not any(i in replicas for i in prev_ids)
    guarded = guarded and not ended
    holders = [i for i in sorted(alive) if holds_state(alive[i], committed_step) and i not in gone] if guarded else []
    if guarded:
        head_pool = [i for i in holders if not (alive[i].cordoned or alive[i].drain_requested)] or holders
    else:
        head_pool = list(continuing) or list(alive)
    head = max((alive[i].step for i in head_pool), default=committed_step)
    return guarded, ended, holders, head


def _outsiders(prev: Quorum | None, alive: Mapping[str, ReplicaView], awaited: Awaited, continuing: Sequence[str],
               guarded: bool, ended: bool, head: int,
               committed_step: int) -> tuple[list[str], bool, list[str], list[str]]:
    """Rule 6: the outsiders that may join, whether a step vouches for one,
    those ready and those pending."""
    continuing_set = set(continuing)
    outsiders = sorted(i for i in alive if i not in continuing_set and not alive[i].drain_requested)
    eligible = [i for i in outsiders
                if not (alive[i].cordoned or alive[i].diverged or alive[i].unreachable) and alive[i].beating]
    # Members a restarted coordinator presumes alive report no step: no vouching for a fresh one.
    up_to = head if ended else max(head, committed_step)
    # A step vouches for a replica only where no member trains on past it:
    # members that may train (after a drop they never wait for a script's
    # replica count: fthsdp/agent/training/catchup/joiner.py; in a fresh job, once
    # the quorum has the count each waits for) may be steps past what their
    # last heartbeats said, so an outsider at that step (a late starter, a
    # holder back from a cut, a restore's late loader) catches up from them
    # like any joiner, ready once near their head. Members that all still
    # wait (a fresh job's quorum smaller than each one's count) stay at their
    # step and serve no copy: there it joins by its step. A member that has
    # not said its count (0: before start(), or an older client) is taken
    # to wait, as before the count was reported.
    waiting = prev is not None and prev.last_drop_id <= 1 and all(
        alive[i].wait_for_replicas == 0 or alive[i].wait_for_replicas > len(prev.members) for i in continuing)
    by_step = not continuing or waiting
    ready = [i for i in eligible if alive[i].ready_since is not None
             or (by_step and alive[i].step >= up_to and not alive[i].catching_up)]
    if guarded:
        # Replicas below the committed step cannot hold the state (rule 8).
        ready = [i for i in ready if holds_state(alive[i], committed_step)]
    if any(i in alive for i in awaited.ids):
        # Members not back since the coordinator started have not said their
        # step (their entries have the one they were admitted at), so nobody
        # is vouched up to date by it: a restarted process at step 0 passed
        # for one when the stored committed step lagged. Admit once they are
        # back or judged (lost: no longer in ``alive``).
        ready = []
    ready_set = set(ready)
    pending = [i for i in eligible if i not in ready_set]
    return eligible, by_step, ready, pending
