"""The quorum decision: which replicas train together, as a pure function.

``decide(prev, replicas, now, rules)`` looks at the current quorum and at what
the coordinator knows of every replica (heartbeats, streams, flags) at time
``now`` and answers either "keep the current quorum" or "form this one", always
with a reason. It reads no clock and does no I/O, so every rule is tested
table-driven with made-up times (tests/test_quorum.py), and the goodput
simulator runs the same code.

This module states the rules and tries them in order (``ORDER``). Each is a
small function of the replicas sorted once per decision (``classify``,
fthsdp/coordinator/decisions/quorum_situation.py) that answers or passes on
(fthsdp/coordinator/decisions/quorum_rules.py, table-tested one by one in
tests/test_quorum_rules.py); every answer gets its members and catch-up
sources the same way (fthsdp/coordinator/decisions/quorum_outcome.py). What
they read and answer is in fthsdp/coordinator/decisions/quorum_types.py; whether one
replica is lost (rule 1's ``lost_at``) in fthsdp/coordinator/decisions/liveness.py; the
checksum vote that flags a diverged member in fthsdp/coordinator/job/checksum_vote.py.

The rules, by number (``ORDER`` below says in which order they are tried):

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
   shrinking to the minority. A cut's heartbeat timeouts run out one by one
   over an interval, so members quiet for over half the timeout count with
   the silent ones. It waits for all of them (``Outage``): those back first
   do not end the wait for the others, a moment behind as a healed cut
   reaches their connections one by one. The same guard keeps a first quorum from forming
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
from collections.abc import Mapping

from fthsdp.coordinator.decisions import quorum_rules as rule
from fthsdp.coordinator.decisions.quorum_outcome import _assign_sources as _assign_sources
from fthsdp.coordinator.decisions.quorum_situation import classify, holds_state
from fthsdp.coordinator.decisions.quorum_types import Decision, Outage, Quorum, ReplicaView, Restoring, Rules
from fthsdp.coordinator.decisions.quorum_types import names as names

ORDER: tuple[rule.Rule, ...] = (
    rule.regroup_members,       # 3: a stuck collective, no member lost: the members regroup
    rule.fast_path,             # 2: every member stays, nobody ready: the quorum stays
    rule.split_brain_members,   # 4: most members silent at once: wait before shrinking
    rule.member_leases,         # 8: no member carries on: wait out the members' leases
    rule.state_lost,            # 8: nobody holds the committed state: no quorum
    rule.restore_first_quorum,  # 9: a restore's first quorum waits for the members that lost it
    rule.too_few,               # 5: fewer than min_replicas: no quorum
    rule.shrink,                # 3: members leave at once, ready joiners with them
    rule.split_brain_first,     # 4: a first quorum needs a majority of the live replicas
    rule.grow,                  # 6: ready joiners are admitted in settled batches
)
"""The rules in the order ``decide`` tries them: the first that applies
decides. A regroup overrides the fast path (nothing else changed, yet the
members must leave their group); the guards that hold a change back (rules
4, 8, 9 and 5) come before the changes they hold (shrink, grow). Rule 1
sorts the replicas before (``classify``); rule 7 completes every answer
(``quorum_outcome.catch_up_sources``)."""


def decide(
    prev: Quorum | None,
    replicas: Mapping[str, ReplicaView],
    now: float,
    rules: Rules,
    prev_catch_up: Mapping[str, str] | None = None,
    committed_step: int = 0,
    regroup: str = "",
    restoring: Restoring | None = None,
    outage: Outage | None = None,
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
    ``outage``: the split-brain guard's wait under way (rule 4), as the
    previous decision left it (``Decision.outage``); None: none.
    """
    situation = classify(prev, replicas, now, rules, prev_catch_up, committed_step, regroup, restoring, outage)
    for applies in ORDER:
        decision = applies(situation)
        if decision is not None:
            return decision
    # Unreachable: with members leaving, shrink answers; without, the fast
    # path, or grow (ready joiners); with no quorum yet, too_few or the
    # split-brain guard answers when nobody is ready.
    raise AssertionError(f"no quorum rule decided: {situation}")


SETTLE_PER_MEMBER = 200e-6
"""Seconds of join settle per member of the current quorum: about what
pushing a change to one member costs the coordinator (benchmarks/README.md)."""


def settle_for(members: int, configured: float) -> float:
    """The join settle in force with ``members`` in the quorum: the configured
    one, or longer in a large quorum (rounded up to 0.1 s steps)."""
    scaled = math.ceil(round(members * SETTLE_PER_MEMBER * 10, 6)) / 10
    return max(configured, scaled)


# ``_assign_sources`` stays importable from here too (tests/test_catchup_auth.py).
__all__ = ["ORDER", "SETTLE_PER_MEMBER", "decide", "holds_state", "names", "settle_for"]
