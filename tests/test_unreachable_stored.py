"""A replica taken out of a stuck collective as unreachable stays kept out
across a coordinator restart (the mark is stored in its ReplicaRecord), and
is let back, the clearing stored too, once its probes reach every member.
In process, on the memory store, with an injected clock: the stuck
collective, the probes and the take-out are driven through the runtime's own
calls. The real-process cases are in tests/test_network_faults.py."""

from __future__ import annotations

import asyncio

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.store import MemoryStore
from fthsdp.core.errors import StoreUnavailable
from fthsdp.protos.v1 import coordinator_pb2 as pb

CONFIG = CoordinatorConfig(min_replicas=1, heartbeat_interval=1.0, heartbeat_timeout=5.0, join_timeout=10.0,
                           join_settle=0.0, hang_floor=2.0, hang_ceiling=2.0)
IDS = ("r0", "r1", "r2")
STEP = 40


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def new_runtime(store: MemoryStore, clock: Clock) -> CoordinatorRuntime:
    runtime = CoordinatorRuntime(CONFIG, store, "coord:1", clock=clock, wall=lambda: 1000.0 + clock.t)
    runtime.leading = True
    return runtime


async def register(runtime: CoordinatorRuntime, rid: str, quorum_id: int = 0) -> str:
    req = pb.RegisterRequest(job="default", replica_id=rid, address=f"{rid}:1", world_size=1, quorum_id=quorum_id,
                             step=STEP, catch_up_addresses=[f"10.0.0.{rid[1:]}:29400"])
    return (await runtime.register(req)).session_id


def beat(runtime: CoordinatorRuntime, sessions: dict[str, str], phase: int, age: float) -> None:
    for rid, session in sessions.items():
        runtime.heartbeat(pb.HeartbeatRequest(
            job="default", replica_id=rid, session_id=session, step=STEP,
            progress=pb.Progress(phase=phase, phase_age_s=age, step=STEP)))


def answer(runtime: CoordinatorRuntime, rid: str, reached: list[str], unreached: list[str]) -> bool:
    job = runtime.jobs["default"]
    probe = job.state.reach.probe_for(rid, job.state.is_member(rid))
    assert probe is not None, f"{rid} was not asked to probe"
    # Rank 0 answers with its session (fthsdp/coordinator/job/identity.py).
    session = job.state.replicas[rid].incarnation.session_id
    return job.state.reach_report(rid, 0, probe.id, reached, unreached, session or "")


def stored(store: MemoryStore, rid: str) -> pb.ReplicaRecord:
    runtime_keys = CoordinatorRuntime(CONFIG, store, "x:1").jobs["default"].keys
    rec = pb.ReplicaRecord()
    rec.ParseFromString(store.get(runtime_keys.replica(rid)).value)
    return rec


async def stuck_until(runtime: CoordinatorRuntime, sessions: dict[str, str], clock: Clock, act: str) -> None:
    """Every member waits in the all-reduce, ever longer, until the escalation does ``act``."""
    job = runtime.jobs["default"]
    for _ in range(40):
        clock.t += 1.0
        beat(runtime, sessions, pb.PHASE_ALLREDUCE, 3.0)
        await runtime.evaluate(job)
        if job.state.reach.escalation.stage.value == act:
            return
    raise AssertionError(f"the escalation never reached {act}: {job.state.reach.note()}")


def test_an_unreachable_mark_survives_a_coordinator_restart_and_is_cleared_once_the_replica_reaches_everyone():
    async def scenario():
        store, clock = MemoryStore(), Clock()
        first = new_runtime(store, clock)
        job = first.jobs["default"]
        sessions = {rid: await register(first, rid) for rid in IDS}
        beat(first, sessions, pb.PHASE_COMPUTE, 0.1)
        await first.evaluate(job)
        assert job.state.quorum.member_ids == IDS, job.state.reason
        await stuck_until(first, sessions, clock, "regrouped")
        await stuck_until(first, sessions, clock, "probing")
        answer(first, "r0", ["r1"], ["r2"])
        answer(first, "r1", ["r0"], ["r2"])
        answer(first, "r2", [], ["r0", "r1"])
        await stuck_until(first, sessions, clock, "watching")  # r2 taken out: the incident is over
        assert job.state.quorum.member_ids == ("r0", "r1"), job.state.reason
        assert stored(store, "r2").unreachable.startswith("unreachable from r0, r1 over the data path"), (
            stored(store, "r2"))
        assert stored(store, "r0").unreachable == ""

        # A new coordinator on the same store (a restart): r2 is still cut.
        clock.t += 1.0
        second = new_runtime(store, clock)
        await second._load(second.jobs["default"])
        job2 = second.jobs["default"]
        qid = job2.state.quorum.id
        sessions = {rid: await register(second, rid, quorum_id=qid if rid != "r2" else 0) for rid in IDS}
        for _ in range(5):
            clock.t += 1.0
            beat(second, sessions, pb.PHASE_COMPUTE, 0.1)
            await second.evaluate(job2)
        assert job2.state.quorum.member_ids == ("r0", "r1"), job2.state.reason
        r2 = next(r for r in second.status(pb.StatusRequest(job="default")).replicas if r.replica_id == "r2")
        assert r2.unreachable.startswith("unreachable from r0, r1 over the data path"), r2
        assert not answer(second, "r2", ["r0"], ["r1"])  # still cut from r1: kept out
        assert stored(store, "r2").unreachable

        # The link is back: r2 reaches both; the clearing is stored.
        clock.t += 4.0
        await second.evaluate(job2)  # asks r2 to probe again
        assert answer(second, "r2", ["r0", "r1"], [])
        await second.evaluate(job2)
        assert stored(store, "r2").unreachable == ""
        assert not job2.state.replicas["r2"].standing.unreachable

    asyncio.run(scenario())


class Transactions(MemoryStore):
    """The memory store, keeping what each transaction put (key -> bytes), in order; ``down`` fails them."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[dict[str, bytes]] = []
        self.down = False

    def transact(self, compares, puts, deletes=()):
        if self.down:
            raise StoreUnavailable("etcd at h:1 is unreachable")
        result = super().transact(compares, puts, deletes)
        if result.succeeded:
            self.puts.append(dict(puts))
        return result


def first_put_marking(store: Transactions, rid: str) -> dict[str, bytes]:
    keys = CoordinatorRuntime(CONFIG, store, "x:1").jobs["default"].keys
    for puts in store.puts:
        if keys.replica(rid) in puts and pb.ReplicaRecord.FromString(puts[keys.replica(rid)]).unreachable:
            return puts
    raise AssertionError(f"{rid}'s unreachable mark was never stored")


async def probed(store: MemoryStore, clock: Clock) -> tuple[CoordinatorRuntime, dict[str, str]]:
    """A stuck collective, probed: r0 and r1 reach each other, nobody reaches r2 (the next decision takes it out)."""
    runtime = new_runtime(store, clock)
    job = runtime.jobs["default"]
    sessions = {rid: await register(runtime, rid) for rid in IDS}
    beat(runtime, sessions, pb.PHASE_COMPUTE, 0.1)
    await runtime.evaluate(job)
    await stuck_until(runtime, sessions, clock, "regrouped")
    await stuck_until(runtime, sessions, clock, "probing")
    answer(runtime, "r0", ["r1"], ["r2"])
    answer(runtime, "r1", ["r0"], ["r2"])
    answer(runtime, "r2", [], ["r0", "r1"])
    return runtime, sessions


def test_the_unreachable_mark_and_the_quorum_that_takes_the_replica_out_are_one_transaction():
    """The decision's one transaction: a coordinator that starts next finds
    either both (r2 kept out) or neither (r2 still a member, no mark)."""

    async def scenario():
        store, clock = Transactions(), Clock()
        runtime, sessions = await probed(store, clock)
        await stuck_until(runtime, sessions, clock, "watching")
        assert runtime.jobs["default"].state.quorum.member_ids == ("r0", "r1")
        puts = first_put_marking(store, "r2")
        keys = runtime.jobs["default"].keys
        assert keys.quorum in puts, f"the mark was stored apart from the quorum: {sorted(puts)}"
        assert list(pb.Quorum.FromString(puts[keys.quorum]).members) and all(
            m.replica_id != "r2" for m in pb.Quorum.FromString(puts[keys.quorum]).members)

    asyncio.run(scenario())


def test_a_mark_the_store_did_not_take_goes_with_the_next_decision_and_nothing_is_applied_before():
    """etcd is down as r2 is taken out: no quorum without r2 is applied and
    the mark is kept in memory; once etcd is back, mark and quorum go in one
    transaction."""

    async def scenario():
        store, clock = Transactions(), Clock()
        runtime, sessions = await probed(store, clock)
        job = runtime.jobs["default"]
        store.down = True
        quorum_before = job.state.quorum.id
        for _ in range(3):  # the take-out decided, again and again, and never stored
            clock.t += 1.0
            beat(runtime, sessions, pb.PHASE_ALLREDUCE, 3.0)
            await runtime.evaluate(job)
        assert job.state.quorum.id == quorum_before and "r2" in job.state.quorum.member_ids, (
            f"a quorum was applied that the store never took: {job.state.quorum}")
        assert job.state.replicas["r2"].standing.unreachable, "the in-memory mark stays, to be stored"
        store.down = False
        clock.t += 1.0
        beat(runtime, sessions, pb.PHASE_ALLREDUCE, 3.0)
        await runtime.evaluate(job)
        assert job.state.quorum.member_ids == ("r0", "r1"), job.state.reason
        puts = first_put_marking(store, "r2")
        assert job.keys.quorum in puts, sorted(puts)

    asyncio.run(scenario())
