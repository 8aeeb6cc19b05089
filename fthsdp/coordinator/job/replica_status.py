"""What ``fthsdp status`` shows of each replica of a job: the view of a
``JobState`` (fthsdp/coordinator/job/state.py) as ``ReplicaStatus`` messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from fthsdp.coordinator.decisions.liveness import latest_return, lost_at
from fthsdp.coordinator.decisions.progress import ProgressBook
from fthsdp.coordinator.decisions.quorum_types import CatchUpSource, Rules
from fthsdp.coordinator.job.replica_entry import ReplicaEntry
from fthsdp.protos.v1 import coordinator_pb2 as pb


class JobView(Protocol):
    """What the status of a job's replicas is read from (a ``JobState``)."""

    rules: Rules
    progress: ProgressBook

    @property
    def replicas(self) -> Mapping[str, ReplicaEntry]: ...

    @property
    def catch_up(self) -> Mapping[str, CatchUpSource]: ...

    @property
    def agents(self) -> Mapping[str, tuple[pb.AgentState, int, str]]: ...

    def is_member(self, replica_id: str) -> bool: ...


def last_return(job: JobView) -> float:
    """``liveness.Awaited.last_return`` of the job's replicas: how long the
    graces of those not back yet last."""
    return latest_return(e.view() for e in job.replicas.values())


def state_of(job: JobView, entry: ReplicaEntry, now: float, returned_at: float = 0.0) -> pb.ReplicaState:
    """``returned_at``: ``last_return(job)``, read once for many entries."""
    if lost_at(entry.view(), now, job.rules, last_return=returned_at) is not None:
        return pb.REPLICA_STATE_FAILED
    if entry.standing.drain_requested:
        return pb.REPLICA_STATE_DRAINING
    if job.is_member(entry.replica_id) and not entry.incarnation.restarted:
        return pb.REPLICA_STATE_HEALTHY
    if entry.replica_id in job.catch_up and entry.incarnation.ready_since is None:
        return pb.REPLICA_STATE_CATCHING_UP
    return pb.REPLICA_STATE_JOINING


def statuses(job: JobView, now: float) -> list[pb.ReplicaStatus]:
    out = []
    returned_at = last_return(job)
    for rid in sorted(job.replicas):
        e = job.replicas[rid]
        inc = e.incarnation
        source = job.catch_up.get(rid)
        agent_state, restarts, agent_detail = job.agents.get(rid, (pb.AGENT_STATE_UNSPECIFIED, 0, ""))
        status = pb.ReplicaStatus(
            replica_id=rid,
            state=state_of(job, e, now, returned_at),
            step=inc.step,
            heartbeat_age_s=round(now - inc.last_heartbeat, 3) if inc.heard_from else -1.0,
            address=inc.address,
            state_checksum=inc.state_checksum,
            checksum_step=inc.checksum_step,
            world_size=inc.world_size,
            cordoned=e.standing.cordoned,
            catch_up_source=source.replica_id if source else "",
            agent_state=agent_state,
            restart_count=restarts,
            agent_detail=agent_detail,
            checksum_mismatch_step=inc.diverged_at or 0,
            catch_up_bytes=inc.catch_up_progress[0],
            catch_up_total_bytes=inc.catch_up_progress[1],
            straggler_score=round(job.progress.scores.get(rid, 0.0), 3),
            hang_reason=inc.hung_reason,
            mismatch_reason=e.standing.mismatch,
            mismatch_strikes=e.standing.strikes,
            unreachable=e.standing.unreachable,
        )
        report = job.progress.rank0(rid)
        # A process that is gone (its agent reported it failed, or its stream closed) is in
        # no phase: its last one would read as current while it restarts. One that hangs
        # or lags is still in the phase it reported, which says where.
        gone = inc.failed_at is not None or inc.disconnected_at is not None
        if report is not None and not gone:
            status.phase = report.phase
            status.phase_age_s = round(report.age + (now - report.received), 3)
            status.step_time_s = report.step_time
            status.compute_time_s = report.compute_time
        out.append(status)
    return out
