"""The quorum decision: which replicas train together, as a pure function.

``decide(prev, replicas, now, rules)`` looks at the current quorum and at what
the coordinator knows of every replica (heartbeats, streams, flags) at time
``now`` and answers either "keep the current quorum" or "form this one", always
with a reason. It reads no clock and does no I/O, so every rule is tested
table-driven with made-up times (tests/test_quorum.py), and the goodput
simulator runs the same code.

This module holds the rules that weigh the replicas against each other. What
they read and answer is in fthsdp/coordinator/decisions/quorum_types.py; whether one
replica is lost (rule 1's ``lost_at``) in fthsdp/coordinator/decisions/liveness.py; the
checksum vote that flags a diverged member in fthsdp/coordinator/job/checksum_vote.py.

The rules, in order:

1. Liveness. A replica is lost when its heartbeats stop for
   ``heartbeat_timeout``, when its Watch stream closes (if
   ``disconnect_is_failure``), when its agent reports a failure, or when
   it made no progress while others waited for it (``hung``). A member
   that registers again as a new incarnation (a restarted process lost its
   state) leaves the quorum too, and comes back as a joiner; so does a member
   whose state checksum disagrees with the other members' at the same step
   (``find_diverged``, fthsdp/coordinator/job/checksum_vote.py). A coordinator that just started (a restart, a
   failover) has heard from nobody: every replica loaded from the store has
   a grace to reconnect (``reconnect_by``) and is neither lost nor silent
   meanwhile. An agent's failure report ends a replica's grace at once
   (fthsdp/coordinator/job/replica_entry.py). Once every other member is back (lost
   after it reconnected counts; failed before it did does not, until its
   restart registers), the one still missing is judged by its heartbeat
   timeout counted from the latest registration (or the start): the
   clients back off while no coordinator answers, so a healthy one may
   be that much later than the others. At the end of the grace, every
   one still missing is judged.
2. Fast path. If every member of the current quorum is alive, not draining and
   not restarted, and no replica is ready to join, the quorum stays as it is
   and its id does not change; this is also how a restarted coordinator keeps
   the quorum its replicas are training in.
3. Shrink now. A lost or draining member is removed at once: the survivors are
   blocked in the all-reduce with it, so waiting costs training time. So is
   one the others cannot reach over the data path (``unreachable``); it is
   alive, but admitted again only once it reaches them. Replicas ready to
   join are admitted in the same change. A collective among healthy members
   that is stuck anyway (a reset connection) is mended by regrouping them:
   the same members in a new quorum, with a new group (``regroup``).
4. Split-brain guard. If more than half of the members went *silent* (heartbeat
   timeout or stream loss rather than an explicit failure, drain or restart),
   that looks more like the coordinator being cut off from them than like that
   many failures at once; the coordinator waits ``join_timeout`` before
   shrinking to the minority. The same guard keeps a first quorum from forming
   out of a minority of the live replicas (torchft's rule). Silences that are
   the coordinator's own (members not back yet after its start) are no
   evidence either way: they do not count until judged (rule 1), and then
   as silent since their heartbeat timeout ran out (the grace the runtime
   gives, ``heartbeat_timeout + join_timeout``, already covers the guard's
   wait).
5. ``min_replicas``. No quorum with fewer members.
6. Grow in batches. A replica joins once it has heartbeated since it
   registered (it is really listening: at 10,000 replicas a registration can
   come through long before the replica's heartbeat stream does) and is up to
   date (its step is the head step, where no member trains on: in a first
   quorum, or one that never dropped a member and whose members all still
   wait for the script's replica count, ``wait_for_replicas``, at their
   step) or says it is ready (its catch-up reached the head). Members that
   may train can be steps past what their last heartbeats said, so an
   outsider at that step catches up from them first. Joiners are
   admitted once no new one has become ready for ``join_settle`` (arrivals
   come in bursts: a thousand replicas starting together then cost a few
   membership changes, not one each), and, if other replicas are still
   catching up, the coordinator waits up to ``join_timeout`` from the first
   ready joiner so that they join together too. ``join_timeout`` also caps
   the wait for a burst to settle. Every change is pushed to every member, so
   the settle time grows with the quorum (``settle_for``): at 10,000 members
   a trickle of arrivals is admitted every few seconds, not one change each.
7. Catch-up sources. Every live replica that is behind the head step gets a
   named source among the members (all up to date: they train in lockstep,
   whatever step their last heartbeat reported), sticky while that source
   stays a member, spread so that no source serves more joiners than it must.
   So does a member still catching up (admitted, its first step in the
   quorum not committed yet), which is never a source itself: if its source
   is lost during that step, it closes its gap from the next one.
8. Committed state. ``committed_step`` is the newest step any member of a
   quorum reported (fthsdp/coordinator/engine/committed.py; 0 for a new job or after a
   give-up). Once no member of the previous quorum continues and it is > 0,
   only *holders* may form a quorum: live replicas at or above it, not
   mid-catch-up, not diverged (``holds_state``); others (a fresh process at
   0, a joiner whose source died) are never admitted nor sources. A holder
   may form the quorum alone (``min_replicas`` and rule 6 permitting).
   Without one no quorum forms ("state lost at step N: ..." names the live
   replicas) until an operator's give-up resets ``committed_step``. If every
   member instead *left* (no failure: finished, drained), the state ended on
   purpose (``state_ended``) and the next replicas start over. The
   split-brain guard counts only replicas that may hold the state: silent
   members may (the coordinator may be cut off from members that train on),
   so a holder outside the old quorum waits ``join_timeout`` for them (rule
   4); replicas known to have lost it (restarted, below the step) count
   neither as silent members nor in a first quorum's majority.
9. A restore's first quorum. While the state is restored from a checkpoint
   (``restoring``), the first quorum after the loss waits for every replica
   that was a member when the state was lost to hold the restored state, or
   for ``join_timeout`` since the first replica did, then forms with whoever
   is there (fthsdp/coordinator/decisions/restore_wait.py): the steps after a restore
   train with the whole global batch, as a fresh job's first do. A member a
   restarted coordinator has not heard from since does not carry the state
   on meanwhile (rule 1 presumes it trains): the restore says it lost it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from fthsdp.coordinator.decisions.lease import unlapsed
from fthsdp.coordinator.decisions.liveness import Awaited, lost_at
from fthsdp.coordinator.decisions.quorum_types import (
    CatchUpSource,
    Decision,
    Member,
    Quorum,
    ReplicaView,
    Restoring,
    Rules,
)
from fthsdp.coordinator.decisions.restore_wait import restore_wait


def holds_state(r: ReplicaView, committed_step: int) -> bool:
    """Whether a replica holds the job's committed state: its step reached
    ``committed_step`` and it is not halfway through a catch-up (its step
    may come from a replay onto a snapshot it does not have yet) or
    diverged."""
    return r.step >= committed_step and (not r.catching_up or r.ready_since is not None) and not r.diverged


def decide(
    prev: Quorum | None,
    replicas: Mapping[str, ReplicaView],
    now: float,
    rules: Rules,
    prev_catch_up: Mapping[str, str] | None = None,
    committed_step: int = 0,
    regroup: str = "",
    restoring: Restoring | None = None,
) -> Decision:
    """Decide the next quorum; see the module docstring for the rules.

    ``prev_catch_up`` maps replica ids to their current source ids, so that a
    joiner is not moved to another source while its transfer runs.
    ``committed_step`` is the job's newest committed step (rule 8).
    ``regroup``: why the members of ``prev`` must form a new quorum among
    themselves although none is lost (a collective among them is stuck:
    fthsdp/coordinator/decisions/stuck.py); "" for none.
    ``restoring``: the committed state is being restored from a checkpoint,
    and which replicas its first quorum waits for (rule 9); None: it is not.
    """
    # After a coordinator (re)start, members not yet back are judged only
    # once every other member is (lost_at).
    awaited = Awaited.of(prev, replicas)
    alive = {i: r for i, r in replicas.items() if lost_at(r, now, rules, awaited.others_back_at(i)) is None}
    prev_ids = set(prev.member_ids) if prev else set()
    prev_members = {m.replica_id: m for m in prev.members} if prev else {}

    # A member that registered again as a new incarnation lost its state: it
    # leaves the quorum and comes back as a joiner.
    # Lists keep a stable order for the reasons; sets answer "in" (10,000 replicas).
    # While a restore is under way no member holds the state: one a restarted
    # coordinator has not heard from since is presumed lost with it (rule 9), not training on.
    gone = awaited.ids if restoring is not None else frozenset()
    continuing = sorted(i for i in prev_ids
                        if i in alive and not (alive[i].restarted or alive[i].diverged or i in gone))
    continuing_set = set(continuing)
    staying = [i for i in continuing if not (alive[i].drain_requested or alive[i].unreachable)]
    # No member carries the state on: only replicas that hold it may (rule 8),
    # unless every member left on purpose (a Leave that was no failure: the
    # job finished, or was drained), which ends the state rather than loses it.
    guarded = committed_step > 0 and not continuing
    ended = guarded and prev is not None and not any(i in replicas for i in prev_ids)
    guarded = guarded and not ended
    holders = [i for i in sorted(alive) if holds_state(alive[i], committed_step) and i not in gone] if guarded else []
    if guarded:
        head_pool = [i for i in holders if not (alive[i].cordoned or alive[i].drain_requested)] or holders
    else:
        head_pool = continuing or list(alive)
    head = max((alive[i].step for i in head_pool), default=committed_step)

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

    def new_members(ids: Sequence[str], next_id: int) -> tuple[Member, ...]:
        out = []
        for i in sorted(ids):
            if i in continuing_set:
                # Unchanged, so that a member list can travel as a delta.
                out.append(prev_members[i])
            else:
                r = alive[i]
                out.append(Member(i, r.address, r.world_size, r.step, next_id))
        return tuple(out)

    def result(ids: Sequence[str] | None, reason: str, settled: bool = False, lost: str = "",
               regrouped: bool = False, leased: tuple[str, ...] = ()) -> Decision:
        next_id = (prev.id if prev else 0) + 1
        members = new_members(ids, next_id) if ids is not None else None
        # The sources are the members (of the new quorum, or those that stay):
        # they train in lockstep, so each is up to date whatever step its last
        # heartbeat said. Without members, the up-to-date ready replicas.
        if members is not None:
            sources = [m.replica_id for m in members]
        elif staying:
            sources = staying
        else:
            sources = [i for i in ready if alive[i].step >= head]
        admitted = {m.replica_id for m in members} if members is not None else set()
        # A member admitted from a catch-up takes its first step with the
        # members' sum, closing its last gap from its source's log; if that
        # source is lost meanwhile it needs another, not a restart.
        in_quorum = admitted if members is not None else set(staying)
        joining = sorted(i for i in in_quorum if i in alive and alive[i].catching_up)
        sources = [i for i in sources if not alive[i].drain_requested and i not in joining]
        behind = [i for i in eligible
                  if (alive[i].step < head or alive[i].catching_up or not by_step) and i not in admitted]
        catch_up = _assign_sources(behind + joining, sources, alive, prev_catch_up or {})
        detail = _summary(prev, alive, replicas, pending, catch_up)
        lost_step = committed_step if lost else 0
        return Decision(members, f"{reason} {detail}".strip(), head, catch_up, settled, lost_step, lost, ended,
                        regrouped, leased)

    def state_lost() -> Decision:
        what = _remains(alive, committed_step)
        return result(None, f"state lost at step {committed_step}: {what}.", lost=what)

    if prev is not None:
        leaving = sorted(prev_ids - set(staying))
        if not leaving and regroup:
            return result(staying + ready, f"regrouping the members of quorum {prev.id}: {regroup}.", regrouped=True)
        if not leaving and not ready:
            # Members not back since the coordinator started are judged as
            # time passes (rule 1): not settled until they are back.
            return result(None, f"quorum {prev.id} unchanged: all {len(prev_ids)} members healthy.",
                          settled=not pending and not awaited.ids)
        if leaving:
            why = {}
            silent = []
            for i in leaving:
                r = replicas.get(i)
                loss = lost_at(r, now, rules, awaited.others_back_at(i)) if r is not None else (now, "left", True)
                if loss is None:
                    assert r is not None  # a replica without a view is lost ("left"), never None
                    why[i] = ("restarted" if r.restarted else "not back, its state lost" if i in gone
                              else "checksum mismatch" if r.diverged
                              else r.unreachable if r.unreachable else "draining")
                    continue
                why[i] = loss[1]
                if not loss[2]:
                    silent.append(loss[0])
            if len(silent) * 2 > len(prev_ids) and now - max(silent) < rules.join_timeout:
                return result(
                    None,
                    f"split-brain guard: {len(silent)} of {len(prev_ids)} members went silent at once; "
                    f"waiting up to join_timeout {rules.join_timeout:g}s before shrinking to the rest.",
                )
            if not continuing:
                # No member carries on: they may train on, cut from this
                # coordinator, until their leases run out (fthsdp/coordinator/decisions/lease.py).
                cut = unlapsed(prev_ids, replicas, now)
                if cut:
                    return result(
                        None,
                        f"member lease: waiting for {names(sorted(cut))} of quorum {prev.id} to stop committing "
                        f"(cut from the coordinator, they may train on until their leases run out) before "
                        f"{'declaring the state lost' if guarded and not holders else 'a quorum without them'}.",
                        leased=tuple(sorted(cut)))
            if guarded and not holders:
                return state_lost()
            restored = None
            if guarded and restoring is not None and ready:
                restored = restore_wait(restoring, ready, replicas, committed_step, now, rules)
            if restored is not None and restored.wait:
                return result(None, restored.reason)
            candidates = staying + ready
            if len(candidates) < rules.min_replicas:
                return result(
                    None,
                    f"no quorum: {len(candidates)} healthy replicas, need min_replicas {rules.min_replicas}.",
                )
            lost_text = names([f"{i} ({why[i]})" for i in leaving])
            admitted = f"; admitting {names(ready)}" if ready else ""
            since = f"; {restored.reason}" if restored is not None else ""
            return result(candidates, f"members leaving: {lost_text}{admitted}{since}.")
        # Only growth from here on.
        candidates = staying + ready
        if len(candidates) < rules.min_replicas:
            return result(None,
                          f"no quorum: {len(candidates)} healthy replicas, need min_replicas {rules.min_replicas}.")
        return _grow_or_wait(result, candidates, ready, pending, alive, now, rules)

    # No quorum yet (a new job, or a job whose quorum record is gone).
    if guarded and not holders:
        return state_lost()
    if len(ready) < rules.min_replicas:
        return result(None, f"waiting for replicas: {len(ready)} ready, need min_replicas {rules.min_replicas}.")
    # Replicas below the committed step cannot hold the state: no vote (rule 8).
    voters = holders if guarded else alive
    if len(ready) * 2 <= len(voters):
        return result(
            None,
            f"split-brain guard: only {len(ready)} of {len(voters)} live replicas"
            f"{' holding the committed state' if guarded else ''} are up to date; waiting for a majority.",
        )
    return _grow_or_wait(result, ready, ready, pending, alive, now, rules)


def _grow_or_wait(result, candidates, ready, pending, alive, now, rules) -> Decision:
    joiners = names(ready)
    first_ready = min(_ready_since(alive[i]) for i in ready)
    last_ready = max(_ready_since(alive[i]) for i in ready)
    if now - last_ready < rules.join_settle and now - first_ready < rules.join_timeout:
        return result(
            None,
            f"waiting for arrivals to settle (join_settle {rules.join_settle:g}s) before admitting {joiners}.",
        )
    if not pending:
        return result(candidates, f"admitting {joiners}: no other replica pending.")
    if now - first_ready >= rules.join_timeout:
        return result(
            candidates,
            f"admitting {joiners} after join_timeout {rules.join_timeout:g}s; "
            f"{len(pending)} still catching up.",
        )
    return result(
        None,
        f"waiting up to join_timeout {rules.join_timeout:g}s for {len(pending)} catching-up "
        f"replicas before admitting {joiners}.",
    )


def names(items: Sequence[str], shown: int = 8) -> str:
    """A list for a reason string, cut short: reasons travel to every replica."""
    if len(items) <= shown:
        return ", ".join(items)
    return f"{', '.join(items[:shown])} and {len(items) - shown} more"


def _remains(alive: Mapping[str, ReplicaView], committed_step: int) -> str:
    """What is left when the state is lost: the live replicas by step, the
    closest to holding it first, with why one at the step does not count."""
    if not alive:
        return "no live replica holds it; no replica is alive"
    items = []
    for r in sorted(alive.values(), key=lambda r: (-r.step, r.replica_id)):
        why = ""
        if r.step >= committed_step:
            why = " (checksum mismatch)" if r.diverged else " (catching up)"
        items.append(f"{r.replica_id} at step {r.step}{why}")
    return f"no live replica holds it; {names(items)}"


def _ready_since(r: ReplicaView) -> float:
    return r.ready_since if r.ready_since is not None else max(r.registered_at, r.first_heartbeat)


SETTLE_PER_MEMBER = 200e-6
"""Seconds of join settle per member of the current quorum: about what
pushing a change to one member costs the coordinator (benchmarks/README.md)."""


def settle_for(members: int, configured: float) -> float:
    """The join settle in force with ``members`` in the quorum: the configured
    one, or longer in a large quorum (rounded up to 0.1 s steps)."""
    scaled = math.ceil(round(members * SETTLE_PER_MEMBER * 10, 6)) / 10
    return max(configured, scaled)


def _assign_sources(
    behind: Sequence[str],
    sources: Sequence[str],
    alive: Mapping[str, ReplicaView],
    prev_catch_up: Mapping[str, str],
) -> dict[str, CatchUpSource]:
    """Give each replica that is behind a source, keeping assignments that still
    hold and balancing the new ones (fewest joiners first, then by id)."""
    if not sources:
        return {}
    load = {s: 0 for s in sources}
    chosen: dict[str, str] = {}
    for i in behind:
        s = prev_catch_up.get(i)
        if s in load:
            chosen[i] = s
            load[s] += 1
    for i in behind:
        if i not in chosen:
            s = min(sources, key=lambda x: (load[x], x))
            chosen[i] = s
            load[s] += 1
    return {
        i: CatchUpSource(s, alive[s].address, alive[s].step, alive[s].catch_up_addresses,
                         alive[s].catch_up_fingerprints) for i, s in chosen.items()
    }


def _summary(prev, alive, replicas, pending, catch_up) -> str:
    dead = len(replicas) - len(alive)
    sourced = sum(i in catch_up for i in pending)
    parts = [f"[{len(alive)} alive", f"{dead} lost", f"{sourced} catching up"]
    if sourced < len(pending):  # no source to catch up from (a lost state)
        parts.append(f"{len(pending) - sourced} with no source")
    away = sum(r.reconnect_by is not None for r in alive.values())  # loaded from the store, not back yet
    silent = sum(not r.beating for r in alive.values()) - away
    if silent:
        parts.append(f"{silent} registered, no heartbeat yet")
    if away:
        parts.append(f"{away} not reconnected yet")
    if prev is not None:
        parts.append(f"quorum {prev.id} has {len(prev.members)} members")
    return "; ".join(parts) + "]"
