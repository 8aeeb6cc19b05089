"""What a joining replica group does next (fthsdp/agent/training/catchup/join_plan.py), table-driven."""

from __future__ import annotations

import pytest

from fthsdp.agent.training.catchup.join_plan import (
    RETRY_SAME_SOURCE_AFTER,
    JoinPlan,
    PlanKind,
    Restore,
    plan_for,
)
from fthsdp.core.errors import FthsdpError
from fthsdp.protos.v1 import coordinator_pb2 as pb

NOW = 1000.0
AT_STEP = 40


def event(*, place: bool = False, members: int = 2, last_drop: int = 1, source: str = "", addresses=("a:1",),
          source_step: int = 50, restore: tuple[str, int] | None = None, finished: int = 0, drain: bool = False):
    e = pb.WatchEvent(quorum=pb.Quorum(id=3, member_count=members, last_drop_id=last_drop), drain_requested=drain)
    if place:
        e.place.CopyFrom(pb.QuorumPlace(rank=1))
    if source:
        e.catch_up.CopyFrom(pb.CatchUp(source_replica_id=source, source_catch_up_addresses=list(addresses),
                                                 source_step=source_step))
    if restore is not None:
        digest, step = restore
        e.restore.CopyFrom(pb.CheckpointRecord(path="/ckpt/step-30", digest=digest, step=step))
    if finished:
        e.finished.CopyFrom(pb.JobFinished(step=finished))
    return e


CASES = [
    # (name, the push, keyword overrides, the plan: None to keep waiting)
    ("no push yet: wait", None, {}, None),
    ("no push yet, SIGTERM: drained", None, {"drain_requested": True}, JoinPlan(PlanKind.DRAINED)),
    ("nothing for it yet: wait", event(), {}, None),
    ("admitted with the members the script waits for", event(place=True, members=2), {}, JoinPlan(PlanKind.ADMITTED)),
    ("admitted into fewer than it waits for, in a fresh job: wait", event(place=True, members=1), {}, None),
    ("admitted into fewer after the job lost a member: trains", event(place=True, members=1, last_drop=2), {},
     JoinPlan(PlanKind.ADMITTED)),
    ("a source named: catch up from it", event(source="r0"), {},
     JoinPlan(PlanKind.CATCH_UP, "r0", ("a:1",), 50)),
    ("a source without catch-up addresses: wait", event(source="r0", addresses=()), {}, None),
    ("the source failed a moment ago: wait for another", event(source="r0"), {"failed": {"r0": NOW - 1}}, None),
    ("the source failed long ago: try it again", event(source="r0"),
     {"failed": {"r0": NOW - RETRY_SAME_SOURCE_AFTER - 0.1}}, JoinPlan(PlanKind.CATCH_UP, "r0", ("a:1",), 50)),
    ("another source failed: catch up from this one", event(source="r1"), {"failed": {"r0": NOW}},
     JoinPlan(PlanKind.CATCH_UP, "r1", ("a:1",), 50)),
    ("admitted wins over a source named", event(place=True, source="r0"), {}, JoinPlan(PlanKind.ADMITTED)),
    ("a checkpoint to restore", event(restore=("d1", 30)), {},
     JoinPlan(PlanKind.RESTORE, restore=Restore("/ckpt/step-30", "d1", 30))),
    ("a checkpoint it already refused: wait", event(restore=("d1", 30)), {"refused": {"d1"}}, None),
    ("a checkpoint of the step it is at: nothing to load", event(restore=("d1", AT_STEP)), {}, None),
    ("a restore wins over an admission", event(restore=("d1", 30), place=True), {},
     JoinPlan(PlanKind.RESTORE, restore=Restore("/ckpt/step-30", "d1", 30))),
    ("the coordinator drains it", event(drain=True, place=True), {}, JoinPlan(PlanKind.DRAINED)),
    ("SIGTERM while a source is named", event(source="r0"), {"drain_requested": True}, JoinPlan(PlanKind.DRAINED)),
    ("the job finished", event(finished=500), {}, JoinPlan(PlanKind.FINISHED, finished_step=500)),
    ("the job finished wins over a drain", event(finished=500, drain=True), {"drain_requested": True},
     JoinPlan(PlanKind.FINISHED, finished_step=500)),
]


@pytest.mark.parametrize("push, overrides, expected", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_plan_for(push, overrides, expected):
    args = {"drain_requested": False, "min_members": 2, "at_step": AT_STEP, "refused": set(), "failed": {},
            "now": NOW} | overrides
    assert plan_for(push, **args) == expected


@pytest.mark.parametrize("plan", [c[3] for c in CASES if c[3] is not None])
def test_a_plan_reaches_the_other_ranks_as_it_was_sent(plan):
    assert JoinPlan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize("sent", [None, {}, {"kind": "dance"}, [1, 2], {"kind": "admitted"}])
def test_a_plan_that_is_not_one_is_an_internal_error_not_a_traceback_elsewhere(sent):
    with pytest.raises(FthsdpError, match="join plan"):
        JoinPlan.from_json(sent)
