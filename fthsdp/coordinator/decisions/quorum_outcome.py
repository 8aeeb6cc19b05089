"""How a quorum rule's answer becomes a ``Decision``: the members, rule 7's catch-up sources, the reason.

A rule (fthsdp/coordinator/decisions/quorum_rules.py) says only which
replicas form the quorum (or None: keep the current one) and why;
``outcome`` completes the answer the same way for every rule: the new
members, unchanged where they continue, a catch-up source for every
replica behind (rule 7), and a summary of the replicas after the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fthsdp.coordinator.decisions.quorum_situation import Situation
from fthsdp.coordinator.decisions.quorum_types import CatchUpSource, Decision, Member, Outage, Quorum, ReplicaView


def outcome(s: Situation, ids: Sequence[str] | None, reason: str, settled: bool = False, lost: str = "",
            regrouped: bool = False, leased: tuple[str, ...] = (), outage: Outage | None = None) -> Decision:
    """The decision to form a quorum of ``ids`` (None: keep the current one)
    because of ``reason``; the other arguments are ``Decision``'s."""
    members = new_members(s, ids) if ids is not None else None
    catch_up = catch_up_sources(s, members)
    detail = _summary(s.prev, s.alive, s.replicas, s.pending, catch_up)
    lost_step = s.committed_step if lost else 0
    return Decision(members, f"{reason} {detail}".strip(), s.head, catch_up, settled, lost_step, lost, s.ended,
                    regrouped, leased, outage)


def new_members(s: Situation, ids: Sequence[str]) -> tuple[Member, ...]:
    """The members of the next quorum, ``ids`` in order: a continuing one
    unchanged, so that a member list can travel as a delta; a new one
    joined at the next quorum's id."""
    next_id = (s.prev.id if s.prev else 0) + 1
    prev_members = {m.replica_id: m for m in s.prev.members} if s.prev else {}
    continuing = set(s.continuing)
    out = []
    for i in sorted(ids):
        if i in continuing:
            out.append(prev_members[i])
        else:
            r = s.alive[i]
            out.append(Member(i, r.address, r.world_size, r.step, next_id))
    return tuple(out)


def catch_up_sources(s: Situation, members: tuple[Member, ...] | None) -> dict[str, CatchUpSource]:
    """Rule 7: a source for every eligible replica behind the head step,
    and for every member still catching up, among the members (of the new
    quorum, or those that stay)."""
    # The members train in lockstep, so each is up to date whatever step its
    # last heartbeat said. Without members, the up-to-date ready replicas.
    if members is not None:
        sources = [m.replica_id for m in members]
    elif s.staying:
        sources = list(s.staying)
    else:
        sources = [i for i in s.ready if s.alive[i].step >= s.head]
    admitted = {m.replica_id for m in members} if members is not None else set()
    # A member admitted from a catch-up takes its first step with the
    # members' sum, closing its last gap from its source's log; if that
    # source is lost meanwhile it needs another, not a restart.
    in_quorum = admitted if members is not None else set(s.staying)
    joining = sorted(i for i in in_quorum if i in s.alive and s.alive[i].catching_up)
    sources = [i for i in sources if not s.alive[i].drain_requested and i not in joining]
    behind = [i for i in s.eligible
              if (s.alive[i].step < s.head or s.alive[i].catching_up or not s.by_step) and i not in admitted]
    return _assign_sources(behind + joining, sources, s.alive, s.prev_catch_up)


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


def _summary(prev: Quorum | None, alive: Mapping[str, ReplicaView], replicas: Mapping[str, ReplicaView],
             pending: Sequence[str], catch_up: Mapping[str, CatchUpSource]) -> str:
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
