"""What a joining replica group does next, decided by its rank 0 from the coordinator's push.

While a replica is not a member, its rank 0 reads the coordinator's newest
push and decides, as a pure function of it (``plan_for``, table-tested in
tests/test_join_plan.py), what the whole group does next: train (admitted),
catch up from the source the push names, load the checkpoint the
coordinator restores the job from, leave (drained), or end (the job
finished). The decision travels to the group's other ranks as a typed
message (``JoinPlan``, JSON over the group's gloo group), so that every rank
takes the same way (fthsdp/agent/training/catchup/joiner.py).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from fthsdp.agent.training.session.job_finished import finished_step
from fthsdp.core.errors import FthsdpError
from fthsdp.protos.v1 import coordinator_pb2 as pb

RETRY_SAME_SOURCE_AFTER = 2.0
"""Seconds before a source that failed is tried again if the coordinator names no other."""


class PlanKind(str, enum.Enum):
    ADMITTED = "admitted"
    """A quorum with enough members includes this replica: it trains."""
    CATCH_UP = "catch-up"
    """Copy the state from the named source (``source``, one address per rank)."""
    RESTORE = "restore"
    """Load the checkpoint the coordinator restores the job's lost state from."""
    DRAINED = "drained"
    """A drain was asked for (SIGTERM, `fthsdp drain`): leave instead of joining."""
    FINISHED = "finished"
    """Every member of the job finished (at ``finished_step``): nothing left to train."""


@dataclasses.dataclass(frozen=True)
class Restore:
    path: str
    digest: str
    step: int


@dataclasses.dataclass(frozen=True)
class JoinPlan:
    """Rank 0's decision for its group's next move, the same on every rank."""

    kind: PlanKind
    source: str = ""
    """CATCH_UP: the source replica."""
    addresses: tuple[str, ...] = ()
    """CATCH_UP: its catch-up servers, one per rank of its group."""
    source_step: int = 0
    """CATCH_UP: the step the source was at when the coordinator named it (for the log)."""
    restore: Restore | None = None
    """RESTORE: the checkpoint."""
    finished_step: int = 0
    """FINISHED: the step the job finished at."""
    fingerprints: tuple[str, ...] = ()
    """CATCH_UP: their certificates' fingerprints, one per rank (pinned TLS:
    fthsdp/agent/training/catchup/tls.py); empty otherwise."""

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "source": self.source, "addresses": list(self.addresses),
                "source_step": self.source_step,
                "restore": dataclasses.asdict(self.restore) if self.restore is not None else None,
                "finished_step": self.finished_step, "fingerprints": list(self.fingerprints)}

    @classmethod
    def from_json(cls, data: object) -> JoinPlan:
        """The plan rank 0 sent; an internal error if it is not one."""
        try:
            assert isinstance(data, dict)
            restore = data["restore"]
            return cls(PlanKind(data["kind"]), str(data["source"]), tuple(str(a) for a in data["addresses"]),
                       int(data["source_step"]),
                       Restore(str(restore["path"]), str(restore["digest"]), int(restore["step"])) if restore
                       else None, int(data["finished_step"]), tuple(str(f) for f in data["fingerprints"]))
        except (AssertionError, KeyError, TypeError, ValueError) as e:
            raise FthsdpError(f"internal: rank 0 of this replica group sent a join plan that is not one: "
                              f"{data!r}") from e


def enough_members(quorum: pb.Quorum, min_members: int) -> bool:
    """Whether a quorum that includes this replica has the members the
    script waits for (``start(wait_for_replicas=N)``): N, so that every
    replica of a fresh job begins at step 0 together; any number once the
    job lost a member (it starts over after an operator gave up the lost
    state, or goes on from a checkpoint restored after every replica was
    lost): the replicas there are then train, as the coordinator's
    ``--min-replicas`` allows, where a script's N would hold them out for
    good when fewer came back (a rack that stays down). The coordinator
    then admits no replica on its step alone into members that train on:
    one that loads the checkpoint after they trained on catches up from
    them. Quorum ids start at 1, and ``last_drop_id`` stays 1 while each
    quorum only added replicas to the one before."""
    return quorum.member_count >= min_members or quorum.last_drop_id > 1


def plan_for(event: pb.WatchEvent | None, *, drain_requested: bool, min_members: int, at_step: int,
             refused: frozenset[str] | set[str], failed: Mapping[str, float], now: float) -> JoinPlan | None:
    """What the group does on the coordinator's push ``event``; None: nothing
    yet, wait for the next push. ``drain_requested``: this replica was asked
    to drain (SIGTERM); ``at_step``: the step its state is at; ``refused``:
    checkpoints (by digest) it could not restore, not tried again;
    ``failed``: when each source last failed it (on the clock of ``now``)."""
    if event is None:
        return JoinPlan(PlanKind.DRAINED) if drain_requested else None
    if finished := finished_step(event):
        return JoinPlan(PlanKind.FINISHED, finished_step=finished)
    if event.drain_requested or drain_requested:
        return JoinPlan(PlanKind.DRAINED)
    r = event.restore
    if event.HasField("restore") and r.step != at_step and r.digest not in refused:
        return JoinPlan(PlanKind.RESTORE, restore=Restore(r.path, r.digest, r.step))
    if event.HasField("place") and enough_members(event.quorum, min_members):
        return JoinPlan(PlanKind.ADMITTED)
    cu = event.catch_up
    if not cu.source_replica_id or not cu.source_catch_up_addresses:
        return None
    if now - failed.get(cu.source_replica_id, -1e9) <= RETRY_SAME_SOURCE_AFTER:
        return None  # it failed a moment ago: wait for the coordinator to name another, or for the retry
    return JoinPlan(PlanKind.CATCH_UP, source=cu.source_replica_id, addresses=tuple(cu.source_catch_up_addresses),
                    fingerprints=tuple(cu.source_catch_up_fingerprints),
                    source_step=cu.source_step)


__all__ = ["RETRY_SAME_SOURCE_AFTER", "JoinPlan", "PlanKind", "Restore", "enough_members", "plan_for"]
