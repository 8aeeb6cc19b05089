"""Ranks' pings in columns (fthsdp/core/rank_digest.py, issue 50): which pings
a digest may carry, that the coordinator takes a digest's ranks exactly as
it takes the same pings whole (their liveness, their progress, a rank that
left kept out), and, through a real gRPC Pings call, that the coordinator
says it reads digests and refuses a digest rank by rank."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from fthsdp.coordinator import validation
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core import rank_digest
from fthsdp.core.errors import InvalidRequest, StaleSession
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import JOB_TOKEN, InProcessCoordinator, leading_runtime, register_request


def ping(rank: int, replica_id: str = "r0", incarnation: str = "inc-1", phase: int = pb.PHASE_COMPUTE,
         step: int = 7, **fields) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(job="default", replica_id=replica_id, incarnation=incarnation, shard_rank=rank,
                               step=step, progress=pb.Progress(phase=phase, phase_age_s=0.25 * rank, step=step,
                                                               step_time_s=1.5, compute_time_s=0.5 + rank),
                               **fields)


@pytest.mark.parametrize(("the_ping", "in_digest"), [
    pytest.param(ping(3), True, id="a rank's ping with progress"),
    pytest.param(ping(0), False, id="rank 0: its session and checksums"),
    pytest.param(pb.HeartbeatRequest(job="default", replica_id="r0", shard_rank=3), False, id="no progress"),
    pytest.param(ping(3, phase=pb.PHASE_SECTION), False, id="in a section: its name and timeout"),
    pytest.param(ping(3, left=True), False, id="its group left"),
    pytest.param(ping(3, ack=True), False, id="asks for an answer"),
    pytest.param(ping(3, local_only=True), False, id="for the relay alone"),
])
def test_what_a_digest_may_carry(the_ping, in_digest):
    digests, whole = rank_digest.encode([the_ping])
    assert rank_digest.digestible(the_ping) is in_digest
    assert (len(digests), len(whole)) == ((1, 0) if in_digest else (0, 1))


def test_a_digest_per_incarnation_says_what_the_pings_said():
    pings = [ping(1), ping(2), ping(5, replica_id="r1"), ping(3, incarnation="inc-0"), ping(4, left=True)]
    digests, whole = rank_digest.encode(pings)
    assert whole == [pings[4]]
    assert [(d.replica_id, d.incarnation, list(d.ranks)) for d in digests] == [
        ("r0", "inc-1", [1, 2]), ("r1", "inc-1", [5]), ("r0", "inc-0", [3])]
    decoded = [p for d in digests for p in rank_digest.decode(d)]
    assert decoded == pings[:4], "nothing the coordinator reads is lost"
    for digest in digests:
        validation.check_rank_digest(digest, set())


def digest(**fields) -> pb.RankDigest:
    base = dict(job="default", replica_id="r0", incarnation="inc-1", ranks=[1, 2], phases=[1, 2],
                phase_ages_s=[0.1, 0.2], steps=[4, 4], step_times_s=[1.0, 1.0], compute_times_s=[0.5, 0.6])
    return pb.RankDigest(**{**base, **fields})


@pytest.mark.parametrize(("fields", "refused"), [
    pytest.param({}, "", id="two ranks"),
    pytest.param({k: [] for k in ("ranks", "phases", "phase_ages_s", "steps", "step_times_s", "compute_times_s")},
                 "", id="empty"),
    pytest.param({"steps": [4]}, "lengths", id="a column short"),
    pytest.param({"ranks": [0, 2]}, "between 1", id="rank 0 heartbeats with its session"),
    pytest.param({"ranks": [1, 1 << 20]}, "between 1", id="past any world size"),
    pytest.param({"ranks": [2, 2]}, "twice", id="a rank twice"),
    pytest.param({"steps": [4, -1]}, "steps", id="a negative step"),
    pytest.param({"phases": [1, pb.PHASE_SECTION]}, "phases", id="a section's rank goes whole"),
    pytest.param({"phases": [1, 99]}, "phases", id="no such phase"),
    pytest.param({"replica_id": "bad id!"}, "replica_id", id="a malformed replica id"),
])
def test_the_checks_of_a_digest(fields, refused):
    if not refused:
        validation.check_rank_digest(digest(**fields), set())
        return
    with pytest.raises(InvalidRequest, match=refused):
        validation.check_rank_digest(digest(**fields), set())


def test_the_coordinator_takes_a_digests_ranks_as_it_takes_the_same_pings_whole():
    async def taken(as_digest: bool):
        runtime, clock = leading_runtime()
        await runtime.register(register_request("r0", world_size=6, incarnation="inc-1"))
        state = runtime.job("default").state
        runtime.batched_rank_ping(ping(5, left=True))  # its group leaves: rank 5 is judged no more
        clock.t += 2.0
        pings = [ping(k) for k in (1, 2, 3, 5)]
        if as_digest:
            digests, whole = rank_digest.encode(pings)
            assert not whole
            runtime.batched_rank_digest(digests[0])
        else:
            for one in pings:
                runtime.batched_rank_ping(one)
        inc = state.replicas["r0"].incarnation
        return dict(inc.rank_heartbeats), set(inc.ranks_left), state.progress.reports["r0"], inc.pings_batched

    whole, columns = asyncio.run(taken(False)), asyncio.run(taken(True))
    assert columns == whole
    beats, left, reports, batched = columns
    assert beats == {1: 2.0, 2: 2.0, 3: 2.0, 4: 0.0}, "rank 4 not heard since its registration, rank 5 left"
    assert left == {5} and set(reports) == {1, 2, 3} and batched
    assert reports[3].compute_time == 3.5 and reports[2].age == 0.5


@pytest.mark.parametrize(("fields", "error"), [
    pytest.param({"incarnation": "inc-0"}, StaleSession, id="an ended incarnation"),
    pytest.param({"ranks": [1, 4]}, InvalidRequest, id="a rank outside its world"),
])
def test_a_digest_the_coordinator_cannot_take(fields, error):
    async def scenario():
        runtime, _ = leading_runtime()
        await runtime.register(register_request("r0", world_size=4, incarnation="inc-1"))
        with pytest.raises(error):
            runtime.batched_rank_digest(digest(**fields))
        assert "r0" not in runtime.job("default").state.progress.reports

    asyncio.run(scenario())


@pytest.fixture
def coordinator(tmp_path):
    token = tmp_path / "token"
    token.write_text(JOB_TOKEN)
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", min_replicas=1, join_settle=0.0,
                                               token_file=str(token)))
    yield c
    c.close()


def test_a_pings_call_says_it_reads_digests_and_refuses_one_rank_by_rank(coordinator):
    from fthsdp.client import CoordinatorClient

    runtime = coordinator.running.runtime
    with CoordinatorClient([coordinator.address], token=JOB_TOKEN) as client:
        client.call("Register", pb.RegisterRequest(job="default", replica_id="r0", address="r0:1", world_size=4,
                                                   agent_ids=["agent-of-r0"], incarnation="inc-1"))
        batch = pb.PingBatch(digests=[digest(ranks=[1, 3]), digest(incarnation="inc-0")])
        call = client.stub(coordinator.address).Pings(iter([batch]), metadata=client.metadata)
        said = dict(call.initial_metadata())
        refusals = list(call)
    assert said.get(rank_digest.RANK_DIGESTS) == "1"
    assert [(r.shard_rank, r.incarnation, r.code) for r in refusals] == [
        (1, "inc-0", grpc.StatusCode.FAILED_PRECONDITION.value[0]),
        (2, "inc-0", grpc.StatusCode.FAILED_PRECONDITION.value[0])]
    reports = runtime.jobs["default"].state.progress.reports["r0"]
    assert {k: (r.phase, r.step) for k, r in reports.items()} == {1: (1, 4), 3: (2, 4)}
