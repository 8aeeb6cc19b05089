"""Coordinator runtimes driven in-process on a fake clock (no processes, no decision
loop): joined replicas, a hung one, a straggler; for the metrics, web and injection tests."""

from __future__ import annotations

import asyncio

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.jobs import agent_of


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def joined_runtime(n: int = 3, jobs: tuple[str, ...] = ("default",),
                         **settings) -> tuple[CoordinatorRuntime, FakeClock, dict]:
    """A leading runtime, no decision loop and no processes: replicas r0..r{n-1}
    of the first job registered and formed quorum 1 at time 0.5. The hang
    limit is at its 2 s floor for step times of 0.2 s."""
    clock = FakeClock()
    config = CoordinatorConfig(job=jobs, min_replicas=1, join_settle=0.0, hang_floor=2.0, **settings)
    runtime = CoordinatorRuntime(config, MemoryStore(), "coord:1", clock=clock, wall=lambda: 1000.0)
    runtime.leading = True  # what start() sets once it loaded the jobs; the tests drive evaluate() themselves
    job = runtime.jobs[config.job[0]]
    sessions = {}
    for i in range(n):
        req = pb.RegisterRequest(job=job.state.name, replica_id=f"r{i}", address=f"h{i}:1", world_size=1,
                                 agent_ids=[agent_of(f"r{i}")])
        sessions[f"r{i}"] = (await runtime.register(req)).session_id
    clock.t = 0.1
    for rid in sessions:
        report(runtime, sessions, rid, 0)
    clock.t = 0.5
    await runtime.evaluate(job)
    assert job.state.quorum is not None and len(job.state.quorum.members) == n
    return runtime, clock, sessions


def report(runtime: CoordinatorRuntime, sessions: dict, rid: str, step: int,
           progress: pb.Progress | None = None) -> None:
    job = next(iter(runtime.jobs))
    runtime.heartbeat(pb.HeartbeatRequest(job=job, replica_id=rid, session_id=sessions[rid], step=step,
                                          progress=progress))


def hung_runtime() -> CoordinatorRuntime:
    """r0 and r1 have waited 6 s in the all-reduce of step 7 while r2 computes
    (at a third of their speed): past the 2 s limit, r2 is taken out as hung."""

    async def scenario() -> CoordinatorRuntime:
        runtime, clock, sessions = await joined_runtime()
        clock.t = 10.0
        for rid, phase, age, compute in (("r0", pb.PHASE_ALLREDUCE, 6.0, 0.1), ("r1", pb.PHASE_ALLREDUCE, 6.0, 0.1),
                                         ("r2", pb.PHASE_COMPUTE, 6.1, 0.35)):
            report(runtime, sessions, rid, 7, pb.Progress(phase=phase, phase_age_s=age, step=7, step_time_s=0.2,
                                                          compute_time_s=compute))
        await runtime.evaluate(runtime.jobs["default"])
        return runtime

    return asyncio.run(scenario())


def straggler_runtime() -> CoordinatorRuntime:
    """r2 computes 3.5 times as long as the others, step after step, under a
    policy of 2x for 10 steps: the runtime cordons it and takes it out at step 11."""

    async def scenario() -> CoordinatorRuntime:
        runtime, clock, sessions = await joined_runtime(straggler_multiple=2.0, straggler_steps=10)
        job = runtime.jobs["default"]
        for step in range(1, 13):
            clock.t += 0.3
            for rid, compute in (("r0", 0.1), ("r1", 0.1), ("r2", 0.35)):
                report(runtime, sessions, rid, step, pb.Progress(phase=pb.PHASE_COMPUTE, phase_age_s=0.0, step=step,
                                                                 step_time_s=0.4, compute_time_s=compute))
            await runtime.evaluate(job)
            if job.state.replicas["r2"].incarnation.hung_reason:
                break
        assert step == 11 and job.state.replicas["r2"].standing.cordoned
        return runtime

    return asyncio.run(scenario())
