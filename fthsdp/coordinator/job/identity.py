"""A call speaks only for its sender, and claims no more than the job has.

Every rank and agent holds the job token, so the token alone proves only
that the caller belongs to the job, not which replica or incarnation it is.
What binds a call to its sender:

* A rank's calls after registering carry the session id the coordinator
  handed to that incarnation (``JobTable._session``): a heartbeat, a Leave, a
  reachability report for any other session is refused.
* A node agent draws a random id at start (``AgentEventRequest.agent_id``)
  and hands it only to the ranks it starts (FTHSDP_AGENT_ID); rank 0
  registers with the ids of every host's agent of its group. A report about
  a replica is taken only from one of the agents whose processes registered
  it (``check_agent_report``); a forged FAILED never takes a healthy replica
  out. While a replica's registered processes are alive, a registration by
  processes of other agents is refused (``check_registration``): it would
  knock the live incarnation out; so is one by a process of an older
  incarnation of the same agents (a rank of an ended round that its host
  has not stopped yet), also right after a coordinator started, while the
  stored incarnation may still come back.
* Values are bounded by what the job has: a registration may not claim a
  quorum newer than the newest formed, nor, outside the quorum, a step past
  the job's committed step (it would pass for the holder of a state nobody
  committed). A heartbeat's step outside the quorum is taken no further than
  the committed step (``bounded_step``).
* A sealed checkpoint is recorded only from a member of the quorum that
  committed its step, of the job's lineage (fthsdp/coordinator/engine/checkpoints.py
  ``lineage_refusal``), in the job's checkpoint folder (``checkpoint_refusal``).

Refusals are ``PermissionDenied`` (someone else's identity: gRPC
PERMISSION_DENIED) or ``OutOfRange`` (a value past the job's: FAILED_PRECONDITION).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from fthsdp.core.auth import PermissionDenied
from fthsdp.core.errors import OutOfRange
from fthsdp.protos.v1 import coordinator_pb2 as pb

if TYPE_CHECKING:
    from fthsdp.coordinator.job.replica_entry import ReplicaEntry
    from fthsdp.coordinator.job.table import JobTable


def alive(entry: ReplicaEntry, now: float, heartbeat_timeout: float) -> bool:
    """Whether a registered incarnation is alive as far as the coordinator knows."""
    inc = entry.incarnation
    return (inc.session_id is not None and inc.failed_at is None and inc.disconnected_at is None
            and now - entry.view_heartbeat() < heartbeat_timeout)


def awaited(entry: ReplicaEntry, now: float) -> bool:
    """Whether a replica loaded from the store (a coordinator that just
    started) may still come back within its grace (fthsdp/coordinator/decisions/liveness.py)."""
    inc = entry.incarnation
    return (inc.session_id is None and not inc.heard_from and inc.failed_at is None
            and inc.reconnect_by is not None and now < inc.reconnect_by)


def _check_successor(table: JobTable, entry: ReplicaEntry, agent_ids: tuple[str, ...], now: float,
                     restart_count: int) -> None:
    """Refuse a registration that would replace the registered incarnation
    while it is alive: an older one of the same agents, or another agent's."""
    inc, replica_id = entry.incarnation, entry.replica_id
    if (set(agent_ids) & set(inc.agent_ids) and restart_count < inc.restart_count
            and (alive(entry, now, table.rules.heartbeat_timeout) or awaited(entry, now))):
        # The same agents' newer incarnation is alive (or, right after this coordinator started, may still
        # come back): this process outlived its incarnation on a host that has not stopped it yet.
        raise OutOfRange(f"replica {replica_id!r}: a process of incarnation {restart_count} registers while "
                         f"incarnation {inc.restart_count} of the same node agents is alive: it outlived its "
                         f"incarnation")
    if inc.agent_ids and not set(agent_ids) & set(inc.agent_ids) and alive(entry, now, table.rules.heartbeat_timeout):
        raise PermissionDenied(
            f"replica {replica_id!r} of job {table.name!r} is registered by processes another node agent started, "
            f"alive at {inc.address}: only one agent runs a replica (give each agent its own --replica-id)")


def check_registration(table: JobTable, replica_id: str, agent_ids: tuple[str, ...], step: int, quorum_id: int,
                       now: float, restart_count: int = 0) -> None:
    entry = table.replicas.get(replica_id)
    if entry is not None:
        _check_successor(table, entry, agent_ids, now, restart_count)
    newest = table.quorum.id if table.quorum is not None else 0
    if newest and quorum_id > newest:
        raise OutOfRange(f"replica {replica_id!r} says it trains in quorum {quorum_id}, but the newest quorum of job "
                         f"{table.name!r} is {newest}")
    member = quorum_id and table.was_member(replica_id, quorum_id)
    if not member and table.committed_step and step > table.committed_step:
        raise OutOfRange(f"replica {replica_id!r} registers at step {step} outside the quorum, past the committed "
                         f"step of job {table.name!r} ({table.committed_step}): no member committed that state")


def check_agent_report(entry: ReplicaEntry | None, replica_id: str, agent_id: str, failure: bool) -> None:
    """Refuse a node agent's report about processes it did not start."""
    if entry is None:
        return  # nothing registered: the report changes nothing but the agent's row
    agent_ids = entry.incarnation.agent_ids
    if agent_ids and agent_id not in agent_ids:
        raise PermissionDenied(f"a report about replica {replica_id!r} from an agent that did not start its "
                               f"registered processes: refused")
    if failure and not agent_ids:
        raise PermissionDenied(f"replica {replica_id!r}'s processes registered without a node agent "
                               f"(FTHSDP_AGENT_ID): no agent's failure report counts for them")


def bounded_step(table: JobTable, replica_id: str, step: int) -> int:
    """A heartbeat's step as recorded: a non-member's is taken no further
    than the job's committed step (members raise that one), so that no
    report passes for a state nobody committed."""
    if replica_id in table._members or not table.committed_step:
        return step
    return min(step, table.committed_step)


def checkpoint_refusal(record: pb.CheckpointRecord, recorded: list[pb.CheckpointRecord]) -> str:
    """Why a reported checkpoint's path is not the job's, or "": its folder
    is named for its step and lineage (fthsdp/agent/training/checkpoint/layout.py)
    and sits beside the ones recorded before."""
    path = PurePosixPath(record.path)
    name = f"step-{record.step:010d}" + (f"-g{record.generation}" if record.generation else "")
    if path.name != name or ".." in path.parts or not path.is_absolute():
        return f"its folder {record.path!r} is not named for step {record.step} of lineage {record.generation}"
    folders = {PurePosixPath(r.path).parent for r in recorded}
    if folders and path.parent not in folders:
        return f"its folder {record.path!r} is not in the job's checkpoint folder ({', '.join(map(str, folders))})"
    return ""


__all__ = ["alive", "awaited", "bounded_step", "check_agent_report", "check_registration", "checkpoint_refusal"]
