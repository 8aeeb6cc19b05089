"""Every replica-level call made with the job token alone, for someone else, is refused and changes nothing.

A real coordinator (gRPC server, decision loop, job token) with two
replicas, r0 and r1, registered by their node agents' processes and trained
to a committed step with a checkpoint recorded. An intruder holds the job
token (every rank and agent has it) and nothing else. Each forged call is
refused with PERMISSION_DENIED (someone else's identity) or
FAILED_PRECONDITION / NOT_FOUND (another incarnation, a value past the
job's), and the job's status is the same afterwards: the quorum, each
replica's state and the recorded checkpoint (fthsdp/coordinator/job/identity.py).
The host-level calls (the Host stream) are tested in tests/test_host_identity.py.
"""

from __future__ import annotations

import grpc
import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.errors import RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import JOB_TOKEN, InProcessCoordinator
from tests.harness.waiting import wait_until

STEP = 10
FOLDER = "/shared/ckpt/default"
DENIED, PRECONDITION, NOT_FOUND = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION,
                                   grpc.StatusCode.NOT_FOUND)


class Job:
    def __init__(self, tmp_path) -> None:
        token = tmp_path / "token"
        token.write_text(JOB_TOKEN)
        self.coordinator = InProcessCoordinator(CoordinatorConfig(
            bind="127.0.0.1:0", min_replicas=2, join_settle=0.0, token_file=str(token),
            heartbeat_timeout=60.0, heartbeat_interval=1.0))
        self.client = CoordinatorClient([self.coordinator.address], token=JOB_TOKEN)
        self.sessions = {}
        for rid in ("r0", "r1"):
            registered = self.client.call("Register", pb.RegisterRequest(
                job="default", replica_id=rid, address=f"{rid}:1", world_size=1, agent_ids=[f"agent-of-{rid}"]))
            self.sessions[rid] = registered.session_id
            self.beat(rid, 0)
        wait_until(lambda: len(self.status().quorum.members) == 2, 30, message="r0 and r1 to form a quorum")
        self.quorum_id = self.status().quorum.id
        for rid in ("r0", "r1"):
            self.beat(rid, STEP)
        self.beat("r0", STEP, checkpoint=self.record(STEP))
        wait_until(lambda: self.status().checkpoint.step == STEP, 30, message="the checkpoint to be recorded")

    def record(self, step: int, folder: str = FOLDER, quorum_id: int | None = None) -> pb.CheckpointRecord:
        return pb.CheckpointRecord(step=step, path=f"{folder}/step-{step:010d}", digest=f"digest-{step}",
                                   quorum_id=self.quorum_id if quorum_id is None else quorum_id, shares=2)

    def beat(self, rid: str, step: int, session: str | None = None, **fields) -> None:
        self.client.call("Heartbeat", pb.HeartbeatRequest(
            job="default", replica_id=rid, session_id=self.sessions[rid] if session is None else session, step=step,
            **fields))

    def status(self) -> pb.StatusResponse:
        return self.client.status()

    def snapshot(self) -> tuple:
        s = self.status()
        return (s.quorum.id, tuple(m.replica_id for m in s.quorum.members), s.committed_step,
                tuple((r.replica_id, r.state, r.agent_state) for r in s.replicas), s.checkpoint.SerializeToString())

    def close(self) -> None:
        self.client.close()
        self.coordinator.close()


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    yield j
    j.close()


def refused(call, code: grpc.StatusCode) -> str:
    with pytest.raises(RequestRejected) as e:
        call()
    assert e.value.code == code, e.value
    return str(e.value)


def test_forged_calls_for_another_replica_are_refused_and_change_nothing(job):
    before = job.snapshot()
    c = job.client

    # A node agent's report about r1 from anyone but r1's agent: a forged FAILED takes nobody out.
    for agent in ("", "agent-of-r0", "forged"):
        why = refused(lambda a=agent: c.call("ReportAgentEvent", pb.AgentEventRequest(
            job="default", replica_id="r1", state=pb.AGENT_STATE_FAILED, restart_count=2**31 - 1, agent_id=a)),
            DENIED)
        assert "did not start its registered processes" in why
    # Registering as the live r1 from another agent's process would knock it out.
    assert "only one agent runs a replica" in refused(lambda: c.call("Register", pb.RegisterRequest(
        job="default", replica_id="r1", address="intruder:1", world_size=1, agent_ids=["forged"])), DENIED)
    # Values past the job's: a quorum never formed, a step nobody committed.
    assert "newest quorum" in refused(lambda: c.call("Register", pb.RegisterRequest(
        job="default", replica_id="intruder", address="intruder:1", world_size=1, step=2**62, quorum_id=2**62)),
        PRECONDITION)
    assert "past the committed step" in refused(lambda: c.call("Register", pb.RegisterRequest(
        job="default", replica_id="intruder", address="intruder:1", world_size=1, step=2**62)), PRECONDITION)
    # Calls in r1's name without r1's session (another incarnation's, or made up).
    refused(lambda: job.beat("r1", 2**62, session="forged"), PRECONDITION)
    refused(lambda: c.call("Leave", pb.LeaveRequest(job="default", replica_id="r1", session_id="forged",
                                                    failed=True, reason="failed: forged")), PRECONDITION)
    refused(lambda: c.call("ReportReach", pb.ReachReportRequest(job="default", replica_id="r1", session_id="forged",
                                                                probe_id=1, unreached=["r0"])), PRECONDITION)
    refused(lambda: c.call("Heartbeat", pb.HeartbeatRequest(job="default", replica_id="nobody", session_id="x",
                                                            step=1)), NOT_FOUND)
    stub = c.stub(c.current_address())
    with pytest.raises(grpc.RpcError) as watch:
        next(iter(stub.Watch(pb.WatchRequest(job="default", replica_id="r1", session_id="forged"),
                             metadata=c.metadata, timeout=10)))
    assert watch.value.code() == PRECONDITION
    # The streams: a Session that registers as the live r1 from another agent, heartbeats on a stream in r1's
    # name without its session.
    with pytest.raises(grpc.RpcError) as session:
        next(iter(stub.Session(iter([pb.SessionRequest(register=pb.RegisterRequest(
            job="default", replica_id="r1", address="intruder:1", world_size=1, agent_ids=["forged"]))]),
            metadata=c.metadata, timeout=10)))
    assert session.value.code() == DENIED
    with pytest.raises(grpc.RpcError) as beats:
        next(iter(stub.HeartbeatStream(iter([pb.HeartbeatRequest(
            job="default", replica_id="r1", session_id="forged", step=2**62, ack=True)]),
            metadata=c.metadata, timeout=10)))
    assert beats.value.code() == PRECONDITION
    assert job.snapshot() == before


def test_checkpoint_records_from_outside_the_lineage_or_the_folder_are_not_taken(job, caplog):
    caplog.set_level("INFO", logger="fthsdp.coordinator")
    before = job.snapshot()
    # A real member's session, but a record outside the job's checkpoint folder.
    job.beat("r0", STEP + 10, checkpoint=job.record(STEP + 10, folder="/etc"))
    # A record of a quorum r0 was never a member of, and one of a lineage the job does not have.
    job.beat("r0", STEP + 20, checkpoint=job.record(STEP + 20, quorum_id=job.quorum_id + 5))
    lineage = job.record(STEP + 30)
    lineage.generation = 3
    job.beat("r0", STEP + 30, checkpoint=lineage)
    # An outsider that registered as itself: no member of the quorum that committed the step.
    outsider = job.client.call("Register", pb.RegisterRequest(job="default", replica_id="intruder",
                                                              address="intruder:1", world_size=1)).session_id
    job.sessions["intruder"] = outsider
    job.beat("intruder", STEP, checkpoint=job.record(STEP + 40))
    # A "refused" checkpoint while no restore is under way drops nothing.
    job.beat("intruder", STEP, refused_checkpoint=f"digest-{STEP}", refused_checkpoint_reason="forged")
    # The checkpoint records are written on the decision loop's next turn: a legitimate one after these
    # shows that they were looked at, and only it is taken.
    job.beat("r0", STEP + 50, checkpoint=job.record(STEP + 50))
    wait_until(lambda: job.status().checkpoint.step == STEP + 50, 30, message="the legitimate record")
    after = job.status()
    assert after.quorum.id == before[0] and [m.replica_id for m in after.quorum.members] == ["r0", "r1"]
    fenced = {r.step: r.reason for r in caplog.records if getattr(r, "event", "") == "checkpoint_fenced"}
    assert sorted(fenced) == [STEP + 10, STEP + 20, STEP + 30, STEP + 40], fenced
    assert "is not in the job's checkpoint folder" in fenced[STEP + 10]
    assert fenced[STEP + 20].startswith("r0 was not a member of quorum")
    assert fenced[STEP + 30].startswith("it is of lineage 3, the job's is 0")
    assert fenced[STEP + 40].startswith("intruder was not a member of quorum")
    assert not [r for r in caplog.records if getattr(r, "event", "") == "checkpoint_refused"], "nothing was dropped"


def test_a_forged_step_in_a_heartbeat_of_an_outsider_is_taken_no_further_than_the_committed_step(job):
    outsider = job.client.call("Register", pb.RegisterRequest(job="default", replica_id="intruder",
                                                              address="intruder:1", world_size=1)).session_id
    job.sessions["intruder"] = outsider
    job.beat("intruder", 2**62)
    status = {r.replica_id: r for r in job.status().replicas}
    assert status["intruder"].step <= STEP and job.status().committed_step == STEP


def test_a_rank_of_another_incarnation_is_not_taken_for_one_of_this_ones(job):
    """The other ranks of a group ping and answer probes with the key rank 0
    registered the incarnation with (RegisterRequest.incarnation)."""
    c = job.client
    session = c.call("Register", pb.RegisterRequest(job="default", replica_id="g", address="g:1", world_size=2,
                                                    agent_ids=["agent-of-g"], incarnation="key-2")).session_id
    ping = pb.HeartbeatRequest(job="default", replica_id="g", shard_rank=1, step=0, incarnation="key-2")
    c.call("Heartbeat", ping)  # its own rank
    for key in ("", "key-1"):  # made up, or the incarnation before
        ping.incarnation = key
        assert "not of its registered incarnation" in refused(lambda: c.call("Heartbeat", ping), PRECONDITION)
        refused(lambda k=key: c.call("ReportReach", pb.ReachReportRequest(
            job="default", replica_id="g", shard_rank=1, probe_id=1, unreached=["r0"], incarnation=k)), PRECONDITION)
    refused(lambda: c.call("ReportReach", pb.ReachReportRequest(
        job="default", replica_id="g", shard_rank=0, session_id="forged", probe_id=1)), PRECONDITION)
    c.call("ReportReach", pb.ReachReportRequest(job="default", replica_id="g", shard_rank=0, session_id=session,
                                                probe_id=1))


def test_a_process_of_an_ended_incarnation_may_not_knock_out_the_live_one(job):
    """A rank of a round that ended, on a host that has not stopped it yet, registers late."""
    c = job.client
    for count in (3, 4):  # the agent restarted the group: incarnation 4 registered last
        job.sessions["g"] = c.call("Register", pb.RegisterRequest(
            job="default", replica_id="g", address=f"g:{count}", world_size=1, agent_ids=["agent-of-g"],
            restart_count=count)).session_id
    job.beat("g", 0)
    assert "outlived its incarnation" in refused(lambda: c.call("Register", pb.RegisterRequest(
        job="default", replica_id="g", address="g:3", world_size=1, agent_ids=["agent-of-g"], restart_count=3)),
        PRECONDITION)
    job.beat("g", 0)  # incarnation 4's session is still the one registered


def test_right_after_a_coordinator_started_a_stale_incarnation_waits_for_the_stored_one_to_be_judged():
    from fthsdp.coordinator.decisions.quorum_types import Rules
    from fthsdp.coordinator.job.replica_entry import grant_reconnect_grace
    from fthsdp.coordinator.job.state import JobState
    from fthsdp.core.errors import OutOfRange

    state = JobState("job", Rules())
    record = pb.ReplicaRecord(replica_id="g", address="g:4", world_size=1, agent_ids=["agent-of-g"], restart_count=4)
    state.load(None, 0, {"g": (record, 7)}, now=100.0)
    grant_reconnect_grace(state.replicas, 115.0)
    with pytest.raises(OutOfRange, match="outlived its incarnation"):
        state.check_registration("g", ("agent-of-g",), 0, 0, 101.0, restart_count=3)
    state.check_registration("g", ("agent-of-g",), 0, 0, 101.0, restart_count=4)  # the stored one, back
    state.check_registration("g", ("agent-of-g",), 0, 0, 116.0, restart_count=3)  # its grace ran out: judged
