"""The quorum rules, one function each, in the order ``decide`` tries them.

Each rule reads one ``Situation`` (the replicas sorted at ``now``:
fthsdp/coordinator/decisions/quorum_situation.py) and answers either a
``Decision`` with its reason, or None: it does not apply, and the next rule
decides. ``decide`` (fthsdp/coordinator/decisions/quorum.py, whose docstring
states the rules by number) tries them in order (``quorum.ORDER``); the
last, ``grow``, answers wherever the others did not. Each checks the
conditions it needs itself, so that a rule asked alone
(tests/test_quorum_rules.py) passes wherever it does not apply; where two
apply, the order decides. Rules 1 (liveness) and 7 (catch-up
sources) decide nothing by themselves: the first sorts the replicas
(``classify``), the second completes every answer (``outcome``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fthsdp.coordinator.decisions.lease import unlapsed
from fthsdp.coordinator.decisions.quorum_outcome import outcome
from fthsdp.coordinator.decisions.quorum_situation import Situation
from fthsdp.coordinator.decisions.quorum_types import Decision, Outage, ReplicaView, names
from fthsdp.coordinator.decisions.restore_wait import RestoreWait, restore_wait

Rule = Callable[[Situation], Decision | None]
"""A rule: the decision, or None where it does not apply."""


def regroup_members(s: Situation) -> Decision | None:
    """Rule 3, a stuck collective: no member leaves, but a collective among
    them is stuck anyway (a reset connection, ``s.regroup`` says which):
    the same members, with the ready joiners, form a new quorum and so a
    new group."""
    if s.prev is None or s.leaving or not s.regroup:
        return None
    return outcome(s, [*s.staying, *s.ready], f"regrouping the members of quorum {s.prev.id}: {s.regroup}.",
                   regrouped=True)


def fast_path(s: Situation) -> Decision | None:
    """Rule 2: every member stays and nobody is ready to join: the quorum,
    and its id, stay as they are (also how a restarted coordinator keeps
    the quorum its replicas train in)."""
    if s.prev is None or s.leaving or s.ready:
        return None
    # Members not back since the coordinator started are judged as
    # time passes (rule 1): not settled until they are back.
    return outcome(s, None, f"quorum {s.prev.id} unchanged: all {len(s.prev_ids)} members healthy.",
                   settled=not s.pending and not s.awaited.ids)


def split_brain_members(s: Situation) -> Decision | None:
    """Rule 4, the members: more than half of them went silent at once, which
    looks more like this coordinator cut off from them than like that many
    failures: wait ``join_timeout`` from the latest silence before shrinking
    to the rest.

    "At once" is as seen through heartbeats: after a cut, the members'
    timeouts run out one by one, spread over a heartbeat interval, so the
    members quiet for over half the timeout count with the silent ones (if
    they beat again, they were not cut). And the wait is for every member
    that went silent then (``Outage``): once most are back, the others are
    likely a moment behind on the same cut's heal, not dead; it ends with
    the first of ``until`` and their return."""
    if s.prev is None or not s.leaving or not s.silent:
        return None
    timeout, prior, count = s.rules.join_timeout, s.outage, len(s.prev_ids)
    quiet = [i for i in s.staying if s.now - s.replicas[i].last_heartbeat > s.rules.heartbeat_timeout / 2]
    if (len(s.silent) + len(quiet)) * 2 > count:
        until = max(s.silent.values()) + timeout
        if prior is not None:
            until = max(until, prior.until)
        if s.now >= until:
            return None
        outage, more = prior, f" and {len(quiet)} more have been quiet for over half the heartbeat timeout"
        if len(s.silent) * 2 > count:
            members = frozenset(s.silent) | (prior.members if prior is not None else frozenset())
            outage, more = Outage(s.prev.id, members, until), " at once"
        return outcome(s, None, f"split-brain guard: {len(s.silent)} of {count} members went silent{more}; "
                                f"waiting up to join_timeout {timeout:g}s before shrinking to the rest.",
                       outage=outage)
    if prior is None or s.now >= prior.until or not prior.members.issuperset(s.silent):
        return None
    back = len(prior.members) - len(s.silent)
    return outcome(s, None, f"split-brain guard: {len(prior.members)} of {count} members went silent at "
                            f"once and {back} are back; waiting up to join_timeout {timeout:g}s past the latest "
                            f"silence for {names(sorted(s.silent))} before shrinking without them.", outage=prior)


def member_leases(s: Situation) -> Decision | None:
    """Rule 8, the leases: no member carries on, and members cut from this
    coordinator may train on until their leases run out
    (fthsdp/coordinator/decisions/lease.py): no quorum without them, and no
    state declared lost, before then."""
    if s.prev is None or not s.leaving or s.continuing:
        return None
    cut = unlapsed(s.prev_ids, s.replicas, s.now)
    if not cut:
        return None
    then = "declaring the state lost" if s.guarded and not s.holders else "a quorum without them"
    return outcome(s, None, f"member lease: waiting for {names(sorted(cut))} of quorum {s.prev.id} to stop "
                            f"committing (cut from the coordinator, they may train on until their leases run out) "
                            f"before {then}.", leased=tuple(sorted(cut)))


def state_lost(s: Situation) -> Decision | None:
    """Rule 8, the state lost: no member carries the committed state on and
    no live replica holds it: no quorum forms until an operator's give-up
    resets the committed step; the reason names what is left."""
    if not s.guarded or s.holders:
        return None
    what = _remains(s.alive, s.committed_step)
    return outcome(s, None, f"state lost at step {s.committed_step}: {what}.", lost=what)


def restore_first_quorum(s: Situation) -> Decision | None:
    """Rule 9: the first quorum after a restore waits for the members when
    the state was lost to load it, or for ``join_timeout`` since the first
    did (fthsdp/coordinator/decisions/restore_wait.py)."""
    restored = restored_wait(s)
    if restored is None or not restored.wait:
        return None
    return outcome(s, None, restored.reason)


def restored_wait(s: Situation) -> RestoreWait | None:
    """Rule 9's answer where it applies: the members leave, only holders may
    form the quorum, a restore is under way and some are ready."""
    if s.prev is None or not s.leaving or not s.guarded or s.restoring is None or not s.ready:
        return None
    return restore_wait(s.restoring, s.ready, s.replicas, s.committed_step, s.now, s.rules)


def too_few(s: Situation) -> Decision | None:
    """Rule 5: no quorum with fewer than ``min_replicas`` members (the
    members that stay and the ready joiners)."""
    candidates = len(s.staying) + len(s.ready)
    need = s.rules.min_replicas
    if candidates >= need:
        return None
    if s.prev is None:
        return outcome(s, None, f"waiting for replicas: {len(s.ready)} ready, need min_replicas {need}.")
    return outcome(s, None, f"no quorum: {candidates} healthy replicas, need min_replicas {need}.")


def shrink(s: Situation) -> Decision | None:
    """Rule 3: a member lost, draining, restarted, diverged or unreachable
    is removed at once (the survivors are blocked in the all-reduce with
    it); the ready joiners are admitted in the same change."""
    if s.prev is None or not s.leaving:
        return None
    restored = restored_wait(s)
    lost = names([f"{i} ({s.why[i]})" for i in s.leaving])
    admitted = f"; admitting {names(s.ready)}" if s.ready else ""
    since = f"; {restored.reason}" if restored is not None else ""
    return outcome(s, [*s.staying, *s.ready], f"members leaving: {lost}{admitted}{since}.")


def split_brain_first(s: Situation) -> Decision | None:
    """Rule 4, a first quorum: it forms only out of a majority of the live
    replicas (torchft's rule); while only holders may form it (rule 8), of
    the live replicas that hold the state."""
    if s.prev is not None:
        return None
    voters = len(s.holders) if s.guarded else len(s.alive)
    if len(s.ready) * 2 > voters:
        return None
    held = " holding the committed state" if s.guarded else ""
    return outcome(s, None, f"split-brain guard: only {len(s.ready)} of {voters} live replicas{held} "
                            f"are up to date; waiting for a majority.")


def grow(s: Situation) -> Decision | None:
    """Rule 6: admit the ready joiners once no new one became ready for
    ``join_settle`` (bursts cost a few changes, not one each) and, while
    others still catch up, once they are done or ``join_timeout`` passed
    since the first ready joiner."""
    if not s.ready:
        return None
    joiners = names(s.ready)
    first_ready = min(_ready_since(s.alive[i]) for i in s.ready)
    last_ready = max(_ready_since(s.alive[i]) for i in s.ready)
    now, rules = s.now, s.rules
    if now - last_ready < rules.join_settle and now - first_ready < rules.join_timeout:
        return outcome(s, None, f"waiting for arrivals to settle (join_settle {rules.join_settle:g}s) "
                                f"before admitting {joiners}.")
    candidates = [*s.staying, *s.ready]
    if not s.pending:
        return outcome(s, candidates, f"admitting {joiners}: no other replica pending.")
    if now - first_ready >= rules.join_timeout:
        return outcome(s, candidates, f"admitting {joiners} after join_timeout {rules.join_timeout:g}s; "
                                      f"{len(s.pending)} still catching up.")
    return outcome(s, None, f"waiting up to join_timeout {rules.join_timeout:g}s for {len(s.pending)} "
                            f"catching-up replicas before admitting {joiners}.")


def _ready_since(r: ReplicaView) -> float:
    """When a ready replica arrived: said it was ready, or else registered
    and heartbeated (rule 6 counts the settle and the timeout from it)."""
    return r.ready_since if r.ready_since is not None else max(r.registered_at, r.first_heartbeat)


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
