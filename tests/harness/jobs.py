"""One job's state (``JobState``) driven by hand: replicas registered and
heartbeating, a quorum formed; for the job, committed, divergence, hang and silence tests."""

from __future__ import annotations

from fthsdp.coordinator.decisions.hang import HangRules
from fthsdp.coordinator.decisions.quorum_types import Rules
from fthsdp.coordinator.job.state import JobState


def agent_of(replica_id: str) -> str:
    """The id of the node agent that runs ``replica_id`` in these tests (RegisterRequest.agent_ids)."""
    return f"agent-of-{replica_id}"


def registered(job: JobState, replica_id: str, *args, now: float, **kwargs) -> str:
    """Register (started by its agent, ``agent_of``), and heartbeat at once
    as an agent does (no replica is admitted before)."""
    kwargs.setdefault("agent_ids", (agent_of(replica_id),))
    session = job.register(replica_id, *args, now=now, **kwargs)
    job.heartbeat(replica_id, session, args[2] if len(args) > 2 else 0, False, "", 0, now=now)
    return session


def formed(job: JobState, now: float):
    decision = job.evaluate(now)
    assert decision.members is not None, decision.reason
    from fthsdp.coordinator.decisions.quorum_types import Quorum

    prev = job.quorum
    quorum = Quorum((prev.id if prev else 0) + 1, decision.members)
    job.apply(decision, quorum, revision=quorum.id)
    return quorum


HANG_RULES = HangRules(multiple=5.0, floor=2.0, ceiling=60.0, section_timeout=100.0)


def joined_job(n=3, hang_rules=HANG_RULES):
    job = JobState("j", Rules(min_replicas=1, heartbeat_timeout=5.0), hang_rules)
    sessions = {}
    for i in range(n):
        rid = f"r{i}"
        sessions[rid] = job.register(rid, f"h:{i}", 1, 0, 0, 0.0, restart_count=2)
        job.heartbeat(rid, sessions[rid], 0, False, "", 0, 0.1)
    decision = job.evaluate(0.2)
    from fthsdp.coordinator.decisions.quorum_types import Quorum
    job.apply(decision, Quorum(1, decision.members), 1)
    return job, sessions
