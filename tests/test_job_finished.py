"""A job whose members all finished: the coordinator's finished mark (what
counts as finished, stored before it is applied, kept across a restart,
cleared only by a reopen), and the replica that arrives afterwards
(fthsdp/agent/training/catchup/joiner.py raises JobFinished). In process, on the memory store; the
end-to-end runs are in tests/test_job_finished_processes.py."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from fthsdp.agent.training.catchup.joiner import Joiner
from fthsdp.agent.training.session.job_finished import JobFinished, finished_line, finished_step
from fthsdp.agent.training.session.report import Reporting
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.decisions.quorum_types import Rules
from fthsdp.coordinator.decisions.status_view import status_dict, status_table
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.job.state import JobState
from fthsdp.coordinator.ledger.value import FixedLedger, Ledger
from fthsdp.coordinator.store import MemoryStore
from fthsdp.core.errors import JobNotFinished
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import formed, registered

RULES = Rules(min_replicas=1, heartbeat_timeout=5.0, join_timeout=0.0)


def trained(job: JobState, ids: tuple[str, ...], step: int, now: float) -> dict[str, str]:
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=now) for rid in ids}
    formed(job, now + 0.1)
    for rid, session in sessions.items():
        job.heartbeat(rid, session, step, False, "", 0, now=now + 0.2)
    return sessions


LEAVE = {"finished": dict(reason="finished"), "drained": dict(reason="drained"),
         "failed": dict(reason="failed: RuntimeError('x')"), "crashed": dict(failed=True, reason="")}


@pytest.mark.parametrize("leaves, finished", [
    ({"a": "finished", "b": "finished"}, True),
    ({"a": "drained", "b": "finished"}, True),  # the end was reached; a drain at the same boundary changes nothing
    ({"a": "drained", "b": "drained"}, False),  # an operator moved the whole job: it ends, the next ones start over
    ({"a": "finished", "b": "failed"}, False),  # a script that raised: the state is lost, not finished
    ({"a": "finished", "b": "crashed"}, False),
    ({"a": "finished"}, False),  # b trains on: one replica's end is not the job's
], ids=lambda v: str(v))
def test_what_finishes_a_job(leaves, finished):
    job = JobState("j", RULES)
    sessions = trained(job, ("a", "b"), 40, 0.0)
    for rid, how in leaves.items():
        job.leave(rid, sessions[rid], now=1.0, **{"failed": False, **LEAVE[how]})
    decision = job.evaluate(1.1)
    mark = job.finish_mark(decision, unix_ms=1234)
    assert (mark is not None) == finished, decision.reason
    if finished:
        assert (mark.step, mark.quorum_id, mark.unix_ms) == (40, job.quorum.id, 1234)


def test_a_replica_that_left_finished_before_the_others_counts_when_they_finish():
    job = JobState("j", RULES)
    sessions = trained(job, ("a", "b", "c"), 40, 0.0)
    job.leave("a", sessions["a"], failed=False, now=1.0, reason="finished")
    decision = job.evaluate(1.1)
    assert job.finish_mark(decision, 0) is None and decision.members is not None  # b and c go on
    formed_quorum = type(job.quorum)(job.quorum.id + 1, decision.members)
    job.apply(decision, formed_quorum, formed_quorum.id)
    for rid in ("b", "c"):
        job.leave(rid, sessions[rid], failed=False, now=2.0, reason="finished")
    assert job.finish_mark(job.evaluate(2.1), 0) is not None


def test_a_finished_job_admits_nobody_and_tells_every_watcher():
    job = JobState("j", RULES)
    sessions = trained(job, ("a", "b"), 40, 0.0)
    for rid, session in sessions.items():
        job.leave(rid, session, failed=False, now=1.0, reason="finished")
    registered(job, "c", "c:1", 1, 0, 0, now=1.05)  # a restarted replica (evicted earlier), arriving with the end
    decision = job.evaluate(1.1)
    assert decision.members is not None, "without the mark, the late arrival would be admitted (the bug)"
    mark = job.finish_mark(decision, 0)
    job.ledger = FixedLedger(Ledger(committed=pb.CommittedStep(finished=mark)))  # stored, as the loop does first
    decision = job.finish(mark, decision)
    job.apply(decision, None, job.quorum_revision)
    assert decision.members is None and "finished at step 40" in decision.reason
    assert job.evaluate(5.0).members is None and job.catch_up == {}
    event = job.watch_event("c", "me")
    assert finished_step(event) == 40 and not event.HasField("place")
    job.ledger = FixedLedger(Ledger(committed=pb.CommittedStep()))  # the reopen, stored
    job.reopen()
    assert [m.replica_id for m in job.evaluate(5.1).members] == ["c"]


# ----- the runtime: stored first, kept across a restart, reopened on purpose ----------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def beat(runtime, sessions, rid, step):
    runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=sessions[rid], step=step))


def test_finished_mark_is_stored_survives_a_restart_and_only_a_reopen_clears_it():
    async def scenario():
        store, clock = MemoryStore(), Clock()
        config = CoordinatorConfig(min_replicas=1, join_settle=0.0, join_timeout=0.5)
        runtime = CoordinatorRuntime(config, store, "coord:1", clock=clock, wall=lambda: 1000.0)
        runtime.leading = True
        job = runtime.jobs["default"]
        sessions = {}
        for rid in ("r0", "r1"):
            req = pb.RegisterRequest(job="default", replica_id=rid, address=f"{rid}:1", world_size=1)
            sessions[rid] = (await runtime.register(req)).session_id
            beat(runtime, sessions, rid, 0)
        clock.t = 0.5
        await runtime.evaluate(job)
        assert len(job.state.quorum.members) == 2
        for rid in sessions:
            beat(runtime, sessions, rid, 500)
        for rid, session in sessions.items():
            await runtime.leave(pb.LeaveRequest(job="default", replica_id=rid, session_id=session, reason="finished"))
        clock.t = 1.0
        await runtime.evaluate(job)
        stored = pb.CommittedStep.FromString(store.get(job.keys.committed).value)
        assert stored.finished.step == 500 and stored.step == 0
        status = runtime.status(pb.StatusRequest())
        assert status.finished.step == 500 and status_dict(status)["finished"]["step"] == 500
        assert "FINISHED at step 500" in status_table(status)
        assert "`fthsdp reopen-job --job default --step 500`" in status_table(status)

        # A coordinator restart (a new runtime on the same store) still knows.
        clock.t = 2.0
        runtime = CoordinatorRuntime(config, store, "coord:2", clock=clock, wall=lambda: 1001.0)
        await runtime._load(runtime.jobs["default"])
        runtime.leading = True
        job = runtime.jobs["default"]
        assert job.state.finished is not None and job.state.finished.step == 500
        r2 = (await runtime.register(pb.RegisterRequest(job="default", replica_id="r2", address="r2:1",
                                                        world_size=1))).session_id
        beat(runtime, {"r2": r2}, "r2", 0)
        clock.t = 3.0
        await runtime.evaluate(job)
        assert job.state.watch_event("r2", "").finished.step == 500
        assert "finished at step 500" in job.state.reason and job.state.catch_up == {}

        with pytest.raises(JobNotFinished, match="finished at step 500, not 499"):
            await runtime.reopen_job(pb.ReopenJobRequest(step=499), "ipv4:1")
        cleared = await runtime.reopen_job(pb.ReopenJobRequest(step=500, requested_by="alice@h"), "ipv4:1")
        assert cleared.finished.step == 500
        assert not pb.CommittedStep.FromString(store.get(job.keys.committed).value).HasField("finished")
        with pytest.raises(JobNotFinished, match="is not finished"):
            await runtime.reopen_job(pb.ReopenJobRequest(step=500), "ipv4:1")
        clock.t = 8.0  # past the heartbeat timeout of r0 and r1, which a restart presumes alive (they left)
        beat(runtime, {"r2": r2}, "r2", 0)
        await runtime.evaluate(job)
        assert [m.replica_id for m in job.state.quorum.members] == ["r2"], job.state.reason
        assert not job.state.watch_event("r2", "").HasField("finished")

    asyncio.run(scenario())


# ----- the replica that arrives: the joiner --------------------------------------------------


class FakeView:
    def __init__(self, event: pb.WatchEvent | None) -> None:
        self.latest = event
        self._cond = threading.Condition()

    def wait_for(self, predicate, timeout):
        if self.latest is not None and predicate(self.latest):
            return self.latest
        raise TimeoutError("no event")


class OneRank:
    rank, size = 0, 1

    def broadcast_json(self, value):
        return value


def joiner_for(event: pb.WatchEvent | None) -> Joiner:
    return Joiner(types.SimpleNamespace(step=0), job="default", replica_id="r2", structure=0, group=OneRank(),
                  view=FakeView(event), reporting=Reporting(),
                  lifecycle=types.SimpleNamespace(drain_requested=False),
                  connect=lambda address, fingerprint: None)


@pytest.mark.parametrize("event, outcome", [
    (pb.WatchEvent(finished=pb.JobFinished(step=500)), "finished"),
    # The mark wins over anything else the push says (a stale place, a source).
    (pb.WatchEvent(finished=pb.JobFinished(step=500), place=pb.QuorumPlace(rank=0),
                   catch_up=pb.CatchUp(source_replica_id="r0", source_catch_up_addresses=["h:1"])), "finished"),
    (pb.WatchEvent(quorum=pb.Quorum(id=3, member_count=1), place=pb.QuorumPlace(rank=0)), "admitted"),
    (pb.WatchEvent(reason="waiting for replicas"), "timeout"),
])
def test_the_joiner_tells_a_finished_job_apart(event, outcome):
    joiner = joiner_for(event)
    if outcome == "finished":
        with pytest.raises(JobFinished) as raised:
            joiner.run(0.05)
        assert str(raised.value) == finished_line("default", 500) == "job default finished at step 500"
        assert raised.value.step == 500
    elif outcome == "admitted":
        assert joiner.run(0.05) is True
    else:
        with pytest.raises(Exception, match="neither admitted nor given a catch-up source in time"):
            joiner.run(0.05)
