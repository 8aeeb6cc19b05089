"""Why a replica diverged, and when its agent stops restarting it (pure):
the message that compares its step inputs with the members'
(fthsdp/coordinator/decisions/divergence.py), the count of mismatch evictions in a row after
a catch-up as JobState keeps it, the inputs each checksum carries
(fthsdp/agent/training/state/checksum.py), and the agent's give-up (fthsdp/agent/node/supervisor.py, with a
stand-in for its watch of the coordinator)."""

from __future__ import annotations

import json
import sys

import pytest

from fthsdp.agent.injection import AgentFaults
from fthsdp.agent.node.agent_state import AgentState
from fthsdp.agent.node.config import AgentConfig
from fthsdp.agent.node.supervisor import Supervisor
from fthsdp.agent.training.state.checksum import MAX_INPUTS, StridedHistory, cap_inputs
from fthsdp.coordinator.decisions import divergence
from fthsdp.coordinator.decisions.quorum_types import Rules
from fthsdp.coordinator.decisions.status_view import status_table
from fthsdp.coordinator.job.state import JobState
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import agent_of, formed, registered
from tests.harness.processes import ROOT, _env

S = AgentState


def groups(*lrs, **extra) -> str:
    return json.dumps([{"lr": lr, "eps": 1e-8, **extra} for lr in lrs], separators=(",", ":"))


@pytest.mark.parametrize("mine, theirs, words", [
    (groups(9.1e-4), groups(9e-4),
     "r2's lr at step 158 was 0.00091, the members' 0.0009: the loop's own state differs from ft.step"),
    (groups(1e-3, 1e-3), groups(1e-3, 5e-4), "r2's lr (param group 1) at step 158 was 0.001, the members' 0.0005:"),
    # Values that differ past the fourth digit are still told apart.
    (groups(1.00001e-3), groups(1.00002e-3), "lr at step 158 was 0.00100001, the members' 0.00100002"),
    (groups(9e-4), groups(9e-4), "differs from the members' although the recorded inputs of that step agree"),
    ("", groups(9e-4), "(no step inputs were reported to compare)"),
    (groups(9e-4), "not json", "(no step inputs were reported to compare)"),
    (groups(1e-3, 1e-3), groups(1e-3), "had 2 param groups, the members' 1"),
    (json.dumps([{"lr": 1, "a": 1, "b": 1, "c": 1}]), json.dumps([{"lr": 2, "a": 2, "b": 2, "c": 2}]),
     "r2's a at step 158 was 1, the members' 2; b was 1, the members' 2; c was 1, the members' 2 and 1 more: "),
    (json.dumps([{"lr": 1e-3}]), json.dumps([{"lr": 1e-3, "momentum": 0.9}]),
     "momentum at step 158 was unset, the members' 0.9"),
])
def test_the_message_names_the_inputs_that_differ(mine, theirs, words):
    assert words in divergence.explain("r2", 158, mine, theirs)


@pytest.mark.parametrize("strikes, caught_up, expected", [
    (0, True, (1, False)),
    (1, True, (2, True)),  # twice in a row after catching up: no third restart
    (2, True, (3, True)),  # an operator started it again anyway: it gives up at the next one
    (0, False, (0, False)),  # a member that diverged on its own (a fault): a plain restart and catch-up
    (1, False, (1, False)),
])
def test_strikes(strikes, caught_up, expected):
    assert divergence.strike(strikes, caught_up) == expected


@pytest.mark.parametrize("admitted, agreed, expected", [
    (150, [], False),
    (150, [151, 200], False),  # agreeing right after the admission proves little: the loop may drift a step later
    (150, [250], True),
    (150, [151, 300], True),
])
def test_a_stretch_that_agrees_resets_the_count(admitted, agreed, expected):
    assert divergence.resets(admitted, agreed) is expected


def test_members_inputs_are_the_most_common_ones():
    assert divergence.members_inputs({"a": "x", "b": "x", "c": "y", "d": ""}) == "x"
    assert divergence.members_inputs({"a": ""}) == ""


# ----- the inputs each checksum carries ------------------------------------------------------


def test_history_reports_each_checksums_inputs_capped():
    history = StridedHistory(every=10)
    reported = history.record(10, "c10", groups(1e-3))
    assert reported == {10: "c10"} and reported.inputs == {10: groups(1e-3)}
    reported = history.record(20, "c20")  # a caller that records none (the default)
    assert reported.inputs == {} and reported == {20: "c20"}
    big = json.dumps([{"lr": 1e-3, **{f"k{i}": i for i in range(40)}} for _ in range(3)])
    assert len(big) > MAX_INPUTS
    capped = cap_inputs(big)
    assert len(capped) <= MAX_INPUTS and json.loads(capped) == json.loads(big)[: len(json.loads(capped))]
    assert cap_inputs(json.dumps([{f"k{i}": i for i in range(200)}])) == ""  # not even one group fits
    assert cap_inputs("x" * 600) == ""


# ----- JobState: the verdict, the count, the reset --------------------------------------------

RULES = Rules(min_replicas=1, heartbeat_timeout=5.0, join_timeout=0.0)


def beat(job, rid, session, step, checksum, lr, now):
    job.heartbeat(rid, session, step, False, checksum, step, now, recent={step: checksum},
                  recent_inputs={step: groups(lr)})


def rejoin(job: JobState, rid: str, now: float) -> str:
    """``rid`` restarts, is named a source, catches up and is admitted again."""
    session = registered(job, rid, f"{rid}:1", 1, 0, 0, now=now)
    decision = job.evaluate(now + 0.01)
    job.apply(decision, None, job.quorum_revision)
    assert rid in job.catch_up, decision.reason
    job.heartbeat(rid, session, 100, True, "", 0, now=now + 0.02)
    formed(job, now + 0.03)
    assert job.is_member(rid)
    return session


def diverge(job, sessions, step, now) -> dict:
    for rid, session in sessions.items():
        beat(job, rid, session, step, "bad" if rid == "c" else "good", 9.1e-4 if rid == "c" else 9e-4, now)
    return job.check_checksums()


def test_twice_in_a_row_after_catching_up_the_verdict_says_give_up():
    job = JobState("j", RULES)
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in "abc"}
    formed(job, 0.1)
    for rid, session in sessions.items():
        job.heartbeat(rid, session, 100, False, "", 0, now=0.2)
    # A member that diverges on its own is no strike: it restarts and catches up.
    verdict = diverge(job, sessions, 101, 0.3)["c"]
    assert (verdict.strikes, verdict.give_up) == (0, False)
    assert "c's lr at step 101 was 0.00091, the members' 0.0009" in verdict.reason
    sessions["c"] = rejoin(job, "c", 1.0)
    verdict = diverge(job, sessions, 102, 1.5)["c"]
    assert (verdict.strikes, verdict.give_up, verdict.step) == (1, False, 102)
    assert job.watch_event("c", "me").divergence == verdict  # what its agent and its Evicted are told
    formed(job, 1.6)
    sessions["c"] = rejoin(job, "c", 2.0)
    assert not job.watch_event("c", "me").HasField("divergence"), "a new incarnation starts with no verdict"
    verdict = diverge(job, sessions, 103, 2.5)["c"]
    assert (verdict.strikes, verdict.give_up) == (2, True)
    assert "2 times in a row after catching up" in verdict.reason
    status = {r.replica_id: r for r in job.replica_statuses(3.0)}["c"]
    assert status.mismatch_strikes == 2 and "the members' 0.0009" in status.mismatch_reason
    job.agent_event("c", pb.AGENT_STATE_GAVE_UP, 2, f"gave up: {verdict.reason}", 3.0, agent_id=agent_of("c"))
    table = status_table(pb.StatusResponse(job="j", replicas=job.replica_statuses(3.0)))
    assert "c checksum mismatch (2 in a row after catching up): c's lr at step 103 was 0.00091" in table
    assert "c GAVE UP (its agent does not restart it): gave up: c's lr" in table


def test_a_stretch_that_agrees_after_a_catch_up_resets_the_count():
    job = JobState("j", RULES)
    sessions = {rid: registered(job, rid, f"{rid}:1", 1, 0, 0, now=0.0) for rid in "abc"}
    formed(job, 0.1)
    for rid, session in sessions.items():
        job.heartbeat(rid, session, 100, False, "", 0, now=0.2)
    diverge(job, sessions, 101, 0.3)
    sessions["c"] = rejoin(job, "c", 1.0)
    assert diverge(job, sessions, 102, 1.5)["c"].strikes == 1
    formed(job, 1.6)
    sessions["c"] = rejoin(job, "c", 2.0)
    admitted = job.quorum.members[[m.replica_id for m in job.quorum.members].index("c")].step
    for step in (admitted + 1, admitted + divergence.STRETCH_STEPS):
        for rid, session in sessions.items():
            beat(job, rid, session, step, f"s{step}", 9e-4, 2.5)
        assert job.check_checksums() == {}
    entry = job.replicas["c"]
    assert (entry.standing.strikes, entry.standing.mismatch) == (0, "")


# ----- the agent gives up on the verdict -------------------------------------------------------

RANK_SCRIPT = str(ROOT / "tests" / "rank_script.py")


class Verdicts:
    """Stands in for fthsdp/agent/node/hang_watch.py: the coordinator's verdicts as its stream would have them."""

    def __init__(self, divergences: dict[int, pb.Divergence], finished_step: int = 0) -> None:
        self.divergences = divergences
        self.finished_step = finished_step
        self.faults = AgentFaults("r2")  # no fault injected (fthsdp/agent/injection.py)

    def notice_for(self, restart_count):
        return None

    def divergence_for(self, restart_count, settle=0.0):
        return self.divergences.get(restart_count)

    def close(self):
        pass


def supervise(tmp_path, plan: str, verdicts: Verdicts) -> tuple[int, list[pb.AgentEventRequest]]:
    (tmp_path / "ranks").mkdir(exist_ok=True)
    events: list[pb.AgentEventRequest] = []
    config = AgentConfig(replica_id="r2", num_replicas=3, max_restarts=5, restart_backoff=0.01, monitor_interval=0.02)
    supervisor = Supervisor(config, [sys.executable, RANK_SCRIPT, str(tmp_path / "ranks"), plan], env=_env(),
                            report=events.append)
    supervisor._hangs = verdicts
    return supervisor.run(), events


def test_the_agent_gives_up_when_the_verdict_says_so(tmp_path):
    why = "r2's lr at step 158 was 0.00091, the members' 0.0009: ..."
    code, events = supervise(tmp_path, "fail", Verdicts({
        0: pb.Divergence(reason=why, strikes=1, restart_count=0),
        1: pb.Divergence(reason=why + "; taken out ... 2 times in a row", strikes=2, restart_count=1, give_up=True),
    }))
    assert code == 1
    assert [S(e.state) for e in events] == [S.STARTING, S.RUNNING, S.FAILED, S.RESTARTING,
                                            S.STARTING, S.RUNNING, S.FAILED, S.GAVE_UP]
    assert events[-1].detail.startswith("gave up: r2's lr at step 158 was 0.00091") and events[-1].restart_count == 1


def test_a_rank_that_exits_0_after_the_job_finished_succeeds_saying_so(tmp_path):
    code, events = supervise(tmp_path, "exit0", Verdicts({}, finished_step=500))
    assert code == 0 and [S(e.state) for e in events] == [S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert events[-1].detail == "every local rank exited 0 (job finished at step 500)"
