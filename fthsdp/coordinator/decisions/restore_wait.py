"""The first quorum after a restore waits for the members whose state was lost (quorum rule 9).

A fresh job's first step waits for the script's replica count
(``start(wait_for_replicas=N)``). A job that lost its state and goes on
from a checkpoint (fthsdp/coordinator/engine/checkpoints.py) no longer keeps that
count on the replicas' side: a job restored onto fewer hosts must still
train (fthsdp/agent/training/catchup/join_plan.py ``enough_members``). Without a wait on the
coordinator's side, the first replica to load the checkpoint formed a
quorum alone and trained on by itself, a third of the global batch, while
the others were still loading; they then copied it, and the data of their
share of those steps was never seen.

So the first quorum after a restore waits for every replica that was a
member when the state was lost (``Restoring.members``) to hold the
checkpoint's state and be ready to join, or for ``join_timeout`` to pass,
and then forms with whoever is there. Those are the members of the last
quorum that trained a step, and of any formed since: processes killed at
once close their streams one after another, and the coordinator drops
them one quorum at a time, in milliseconds, so the last quorum before the
loss may hold only the last one to go.

The timeout counts from when the first replica came to hold the state (it
reported the checkpoint's step: ``ReplicaView.step_since``), not from the
restore itself nor from the registrations: loading a large checkpoint may
take longer than the timeout, and the replicas load in parallel, so what
the timeout must bound is how far apart they finish, as rule 6 counts
from the first ready joiner. A member that does not come back (its host
is down) then costs one ``join_timeout`` after the first one is ready. A
coordinator that restarts meanwhile knows the restore from the store
(``checkpoints.under_way``), but of the members only the stored quorum's
(the store keeps no older one): it waits for those, and the replicas
register again, so the wait counts from then (at most one more
``join_timeout``); members dropped before the last quorum are admitted if
they are ready by then, and otherwise catch up.

Members that could not be admitted anyway (cordoned, draining, unreachable
from the others) are not waited for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from fthsdp.coordinator.decisions.quorum_types import ReplicaView, Restoring, Rules, names


@dataclasses.dataclass(frozen=True)
class RestoreWait:
    """Whether the first quorum after a restore forms now, and why."""

    wait: bool
    """True: no quorum yet, members of the lost quorum may still come back."""
    reason: str
    """Why it waits, or (to add to the new quorum's reason) why it forms now."""


def restore_wait(restoring: Restoring, ready: Sequence[str], replicas: Mapping[str, ReplicaView],
                 committed_step: int, now: float, rules: Rules) -> RestoreWait:
    """Whether the first quorum after the restore of ``committed_step``
    forms now out of ``ready`` (non-empty: replicas that hold the state and
    may join), or waits for the members of ``restoring`` not among them."""
    ready_set = set(ready)
    members = sorted(restoring.members)
    missing = [i for i in members if i not in ready_set and _may_come(replicas.get(i))]
    what = f"the checkpoint of step {committed_step}"
    qid = restoring.quorum_id
    if not missing:
        which = "" if all(i in ready_set for i in members) else " that may join"
        return RestoreWait(False, f"every member{which} when the state was lost is back with {what}")
    first = min(held_since(replicas[i]) for i in ready)
    waited = now - first
    if waited >= rules.join_timeout:
        return RestoreWait(False, f"join_timeout {rules.join_timeout:g}s passed since the first replica loaded "
                                  f"{what}; {_members(missing, qid)} not back")
    # No countdown in the reason: it is logged each time it changes.
    return RestoreWait(True, f"restored {what}: waiting up to join_timeout {rules.join_timeout:g}s "
                             f"for {_members(missing, qid)} before admitting {names(ready)}.")


def held_since(r: ReplicaView) -> float:
    """When a ready replica came to hold the state at its step: it registered,
    heartbeated and reported the step (the latest of the three)."""
    return max(r.registered_at, r.first_heartbeat, r.step_since)


def _may_come(r: ReplicaView | None) -> bool:
    """Whether a member not ready yet could be admitted once it is."""
    return r is None or not (r.cordoned or r.drain_requested or r.unreachable)


def _members(ids: Sequence[str], qid: int) -> str:
    return (f"{names(ids)} ({'a member' if len(ids) == 1 else 'members'} when the state was lost; "
            f"quorum {qid} trained the last step)")
