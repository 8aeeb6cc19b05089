"""What the table-driven tests of the quorum decision share (fthsdp/coordinator/decisions/quorum.py):
made-up replica views on an injected clock, and the check of one case."""

from __future__ import annotations

import dataclasses

from fthsdp.coordinator.decisions.quorum import decide
from fthsdp.coordinator.decisions.quorum_types import Member, Quorum, ReplicaView, Restoring, Rules

NOW = 1000.0
RULES = Rules(min_replicas=1, heartbeat_timeout=5.0, join_timeout=10.0)


def alive(rid: str, step: int = 100, **kw) -> ReplicaView:
    fields = {"last_heartbeat": NOW - 1, "registered_at": NOW - 60, **kw}
    return ReplicaView(rid, address=f"{rid}:1", step=step, **fields)


def silent(rid: str, since: float = 1.0, **kw) -> ReplicaView:
    """Heartbeats stopped; the timeout ran out ``since`` seconds ago."""
    return dataclasses.replace(alive(rid, **kw), last_heartbeat=NOW - RULES.heartbeat_timeout - since)


GRACE = RULES.heartbeat_timeout + RULES.join_timeout
"""The reconnection grace the runtime gives after a (re)start (fthsdp/coordinator/engine/runtime.py)."""


def awaited(rid: str, started: float, grace: float = GRACE, **kw) -> ReplicaView:
    """Loaded from the store by a coordinator that started ``started``
    seconds before NOW, and not reconnected since."""
    start = NOW - started
    return dataclasses.replace(alive(rid, **kw), last_heartbeat=start, registered_at=start, beating=False,
                               reconnect_by=start + grace)


def quorum(*ids: str, qid: int = 7) -> Quorum:
    return Quorum(qid, tuple(Member(i, f"{i}:1", 1, 100, 3) for i in ids), step=100)


def table(*views: ReplicaView) -> dict[str, ReplicaView]:
    return {v.replica_id: v for v in views}


@dataclasses.dataclass
class Case:
    name: str
    prev: Quorum | None
    replicas: dict[str, ReplicaView]
    expect: tuple[str, ...] | None
    reason: str
    rules: Rules = RULES
    now: float = NOW
    catch_up: dict[str, str] = dataclasses.field(default_factory=dict)
    prev_catch_up: dict[str, str] = dataclasses.field(default_factory=dict)
    committed: int = 0
    """The job's committed step, an input of the decision (rule 8)."""
    lost: int = 0
    """The state_lost_step expected."""
    ended: bool = False
    """Whether the members ended the state on purpose."""
    restoring: Restoring | None = None
    """A restore from a checkpoint under way (rule 9)."""




def check(case: Case) -> None:
    decision = decide(case.prev, case.replicas, case.now, case.rules, case.prev_catch_up, case.committed,
                      restoring=case.restoring)
    got = tuple(m.replica_id for m in decision.members) if decision.members is not None else None
    assert got == case.expect, decision.reason
    assert case.reason in decision.reason
    assert {k: v.replica_id for k, v in decision.catch_up.items()} == case.catch_up
    assert decision.state_lost_step == case.lost, decision.reason
    assert decision.state_ended == case.ended, decision.reason
    assert decision.reason.startswith("state lost at step ") == bool(case.lost)
    if case.lost:
        assert decision.state_lost.startswith("no live replica holds it; ")
        assert decision.reason.startswith(f"state lost at step {case.lost}: {decision.state_lost}.")
