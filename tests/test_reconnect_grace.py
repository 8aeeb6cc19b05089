"""A coordinator that just started (a restart, a failover) gives every
replica from the store a grace to reconnect (fthsdp/coordinator/engine/runtime.py
``_grant_grace``, quorum rule 1): in process, on the memory store, with an
injected clock. The real-process runs are in tests/test_coordinator_restart.py;
the decision's cases in tests/test_quorum.py."""

from __future__ import annotations

import asyncio
import logging

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine import committed
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.store import MemoryStore
from fthsdp.protos.v1 import coordinator_pb2 as pb

CONFIG = CoordinatorConfig(min_replicas=1, heartbeat_interval=1.0, heartbeat_timeout=5.0, join_timeout=10.0,
                           join_settle=0.0)
GRACE = CONFIG.heartbeat_timeout + CONFIG.join_timeout
IDS = ("r0", "r1", "r2")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def register(runtime: CoordinatorRuntime, rid: str, quorum_id: int = 0, step: int = 0) -> str:
    req = pb.RegisterRequest(job="default", replica_id=rid, address=f"{rid}:1", world_size=1, quorum_id=quorum_id,
                             step=step, agent_ids=[f"agent-of-{rid}"])
    session = (await runtime.register(req)).session_id
    runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=session, step=step))
    return session


def beat(runtime: CoordinatorRuntime, rid: str, step: int = 41) -> None:
    session = runtime.jobs["default"].state.replicas[rid].incarnation.session_id
    runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=session, step=step))


async def trained_then_restarted(clock: Clock) -> tuple[CoordinatorRuntime, int]:
    """Three replicas in a quorum under one coordinator; then a new one on the
    same store (its restart), started at t=100. Returns it and the quorum id."""
    store = MemoryStore()
    first = CoordinatorRuntime(CONFIG, store, "coord:1", clock=clock, wall=lambda: 1000.0)
    first.leading = True
    job = first.jobs["default"]
    sessions = {rid: await register(first, rid) for rid in IDS}
    clock.t = 0.5
    await first.evaluate(job)
    assert job.state.quorum.member_ids == IDS, job.state.reason
    for rid, session in sessions.items():  # they train: the committed step is stored
        first.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=session, step=40))
    await committed.sync(job.committed, job.state, 5.0, 1_000_000)
    clock.t = 100.0
    second = CoordinatorRuntime(CONFIG, store, "coord:1", clock=clock, wall=lambda: 1100.0)
    await second._load(second.jobs["default"])
    second.leading = True
    return second, job.state.quorum.id


def test_the_restarted_coordinator_says_how_long_each_replica_has(caplog):
    async def scenario():
        with caplog.at_level(logging.INFO, logger="fthsdp.coordinator"):
            await trained_then_restarted(Clock())
    asyncio.run(scenario())
    assert (f"job default: 3 replicas from the store; each has {GRACE:g}s to reconnect before it is judged"
            in caplog.text)


def test_members_not_back_are_kept_past_their_timeout_and_the_last_one_judged_after_the_others_are_back():
    async def scenario():
        clock = Clock()
        runtime, qid = await trained_then_restarted(clock)
        job = runtime.jobs["default"]
        clock.t = 100.0 + CONFIG.heartbeat_timeout + 1  # past the heartbeat timeout from the start
        await runtime.evaluate(job)
        assert job.state.quorum.id == qid and "unchanged" in job.state.reason, job.state.reason
        await register(runtime, "r0", qid, 40)
        await runtime.evaluate(job)
        assert job.state.quorum.id == qid, job.state.reason  # r2 is not the only one missing
        await register(runtime, "r1", qid, 40)
        await runtime.evaluate(job)  # the others are back: r2 has a heartbeat timeout from now
        assert job.state.quorum.id == qid, job.state.reason
        back = clock.t
        for t in (back + 2.0, back + 4.0, back + CONFIG.heartbeat_timeout):
            clock.t = t
            for rid in ("r0", "r1"):
                beat(runtime, rid)
            await runtime.evaluate(job)
            if t < back + CONFIG.heartbeat_timeout:
                assert job.state.quorum.id == qid, job.state.reason
        # and is judged when it runs out
        assert job.state.quorum.member_ids == ("r0", "r1"), job.state.reason
        assert "r2 (not reconnected since the coordinator started)" in job.state.quorum.reason
    asyncio.run(scenario())


def test_the_end_of_the_grace_is_decided_on_by_itself():
    async def scenario():
        clock = Clock()
        runtime, qid = await trained_then_restarted(clock)
        job = runtime.jobs["default"]
        await register(runtime, "r0", qid, 40)
        session = job.state.replicas["r0"].incarnation.session_id
        for t in range(101, int(100 + GRACE)):  # r0 heartbeats on, r1 and r2 stay away
            clock.t = float(t)
            runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id="r0", session_id=session, step=t))
            await runtime.evaluate(job)
            assert job.state.quorum.id == qid, job.state.reason
        clock.t = 100.0 + GRACE  # no registration, no heartbeat timeout: the grace's end alone
        await runtime.evaluate(job)
        assert job.state.quorum.member_ids == ("r0",), job.state.reason
    asyncio.run(scenario())


def test_a_restarted_incarnation_leaves_at_once_while_others_are_still_missing():
    async def scenario():
        clock = Clock()
        runtime, qid = await trained_then_restarted(clock)
        job = runtime.jobs["default"]
        clock.t = 101.0
        await register(runtime, "r2", 0, 0)  # its agent restarted it: a fresh process
        await runtime.evaluate(job)
        assert job.state.quorum.member_ids == ("r0", "r1"), job.state.reason  # r0, r1 keep their places
        assert "r2 (restarted)" in job.state.quorum.reason
    asyncio.run(scenario())


def test_an_agent_reporting_a_failure_of_a_member_not_back_yet_ends_its_grace():
    async def scenario():
        clock = Clock()
        runtime, qid = await trained_then_restarted(clock)
        job = runtime.jobs["default"]
        clock.t = 101.0
        await register(runtime, "r0", qid, 40)
        runtime.agent_event(pb.AgentEventRequest(job="default", replica_id="r2", state=pb.AGENT_STATE_RUNNING,
                                                 agent_id="agent-of-r2"))
        await runtime.evaluate(job)
        assert job.state.quorum.id == qid, job.state.reason  # a report of life changes nothing
        runtime.agent_event(pb.AgentEventRequest(job="default", replica_id="r2", state=pb.AGENT_STATE_FAILED,
                                                 detail="local rank 0 exited with signal SIGKILL",
                                                 agent_id="agent-of-r2"))
        await runtime.evaluate(job)  # r1 is still missing, and keeps its place
        assert job.state.quorum.member_ids == ("r0", "r1"), job.state.reason
        assert "r2 (reported failed)" in job.state.quorum.reason
    asyncio.run(scenario())


def test_the_grace_is_paced_for_as_many_senders_as_the_store_lists(caplog):
    """At thousands of hosts the pace stretches the heartbeat timeout; a
    grace from the configured one would end before the replicas are even
    expected to have heartbeated once."""
    import dataclasses

    async def scenario():
        clock = Clock()
        store = MemoryStore()
        config = dataclasses.replace(CONFIG, heartbeat_budget=1.0)  # 3 senders at most 1 a second: a 3 s interval
        first = CoordinatorRuntime(config, store, "coord:1", clock=clock, wall=lambda: 1000.0)
        first.leading = True
        for rid in IDS:
            await register(first, rid)
        clock.t = 0.5
        await first.evaluate(first.jobs["default"])
        clock.t = 100.0
        second = CoordinatorRuntime(config, store, "coord:1", clock=clock, wall=lambda: 1100.0)
        with caplog.at_level(logging.INFO, logger="fthsdp.coordinator"):
            await second._load(second.jobs["default"])
    asyncio.run(scenario())
    paced = 3 * CONFIG.heartbeat_timeout + CONFIG.join_timeout  # the timeout stretched with the interval
    assert f"job default: 3 replicas from the store; each has {paced:g}s to reconnect" in caplog.text


def test_the_grace_lasts_while_replicas_from_the_store_keep_coming_back():
    async def scenario():
        clock = Clock()
        runtime, qid = await trained_then_restarted(clock)
        job = runtime.jobs["default"]
        clock.t = 100.0 + GRACE - 1.0
        await register(runtime, "r0", qid, 40)  # r1 and r2 still in the queue
        for t in (100.0 + GRACE + 1.0, 100.0 + GRACE + CONFIG.heartbeat_timeout - 1.5):
            clock.t = t
            beat(runtime, "r0")
            await runtime.evaluate(job)
            assert job.state.quorum.id == qid, job.state.reason  # past the grace, within r0's return + timeout
        await register(runtime, "r1", qid, 40)
        back = clock.t
        clock.t = back + CONFIG.heartbeat_timeout - 0.5
        for rid in ("r0", "r1"):
            beat(runtime, rid)
        await runtime.evaluate(job)
        assert job.state.quorum.id == qid, job.state.reason
        clock.t = back + CONFIG.heartbeat_timeout
        await runtime.evaluate(job)
        assert job.state.quorum.member_ids == ("r0", "r1"), job.state.reason
        assert "r2 (not reconnected since the coordinator started)" in job.state.quorum.reason
    asyncio.run(scenario())
