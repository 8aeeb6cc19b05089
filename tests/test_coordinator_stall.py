"""A coordinator whose own process stalls (a loaded machine, a long GC, a
SIGSTOP) must not count its live replicas lost for its own silence.

The decision taken first after the stall may run before the loop-lag prober
does: the stall is then only visible as the prober being overdue
(fthsdp/coordinator/engine/loop_lag.py). In process, on a fake clock: the prober's
last run is recorded by hand, then the clock jumps as it does across a stall.

Then as a real process, SIGSTOPped for longer than its lease: on the memory
store it leads on (fthsdp/coordinator/store/leadership.py, ``sole``; the lease lasts 3 s), and keeps its
members (there, the heartbeats queued during the stop are answered before
its next decision, so only the in-process test reaches the prober's case).
"""

from __future__ import annotations

import asyncio
import signal
import time

from tests.harness.events import JsonLog, has
from tests.harness.processes import CoordinatorProcess, ReplicaProcess
from tests.harness.runtimes import joined_runtime, report


def test_the_first_decision_after_a_stall_keeps_the_live_members():
    async def scenario() -> tuple[int, int, list[str], str]:
        runtime, clock, sessions = await joined_runtime(heartbeat_interval=0.5, heartbeat_timeout=1.0, join_timeout=2.0)
        job = runtime.jobs["default"]
        qid = job.state.quorum.id
        clock.t = 1.0
        for rid in sessions:
            report(runtime, sessions, rid, 1)
        runtime.lag.record(clock.t, 0.0)  # the prober ran here; then the whole process stalled
        clock.t += 5.6
        await runtime.evaluate(job)  # before any heartbeat queued during the stall, or the prober, runs
        return qid, job.state.quorum.id, sorted(m.replica_id for m in job.state.quorum.members), job.state.state_lost

    before, after, members, lost = asyncio.run(scenario())
    # Past heartbeat_timeout + join_timeout, the split-brain guard no longer
    # holds: judged silent, the members would be dropped and the state lost.
    assert lost == "", f"the state counted lost for the coordinator's own stall: {lost}"
    assert after == before, "a quorum change for the coordinator's own stall"
    assert members == ["r0", "r1", "r2"]


def test_a_replica_silent_beyond_the_stall_is_still_lost():
    async def scenario() -> list[str]:
        runtime, clock, sessions = await joined_runtime(heartbeat_interval=0.5, heartbeat_timeout=1.0, join_timeout=2.0)
        job = runtime.jobs["default"]
        clock.t = 1.0
        for rid in sessions:
            report(runtime, sessions, rid, 1)
        runtime.lag.record(clock.t, 0.0)
        clock.t += 5.6  # the stall
        runtime.lag.record(clock.t, 5.6)  # the prober catches up and records it
        for _ in range(40):  # then r2 stays silent while the others go on, well past the stall's allowance
            clock.t += 0.5
            runtime.lag.record(clock.t, 0.0)
            report(runtime, sessions, "r0", 1)
            report(runtime, sessions, "r1", 1)
            await runtime.evaluate(job)
        return sorted(m.replica_id for m in job.state.quorum.members)

    assert asyncio.run(scenario()) == ["r0", "r1"]


STALL = 4.0
"""Seconds the coordinator is stopped: past heartbeat_timeout + join_timeout
(1 s + 2 s here), where the split-brain guard no longer holds silent members."""


def test_a_coordinator_process_stopped_for_seconds_keeps_its_members(tmp_path):
    coordinator = CoordinatorProcess(tmp_path, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s",
                                     "--join-timeout", "2s", "--min-replicas", "1", "--log-format", "json").start()
    replicas = [ReplicaProcess(tmp_path, coordinator.address, f"r{i}", "--step-period", "0.05").start()
                for i in range(2)]
    log = JsonLog(tmp_path / "coordinator.log")
    try:
        first = [r.wait_members(["r0", "r1"], timeout=30) for r in replicas][0]
        log.wait_event("quorum_change", 10, quorum_id=first["quorum_id"])
        coordinator.signal(signal.SIGSTOP)
        time.sleep(STALL)  # the stall itself, not a wait for anything
        coordinator.signal(signal.SIGCONT)
        # A decision after the stall, to anchor the absence below: r1 killed,
        # r0 goes on alone in the next quorum.
        replicas[1].kill()
        alone = replicas[0].wait_members(["r0"], timeout=30)
        change = log.wait_event("quorum_change", 10, quorum_id=alone["quorum_id"])
        assert alone["quorum_id"] == first["quorum_id"] + 1, f"quorums in between: {log.events_named('quorum_change')}"
        assert has("r1")(change["reason"]) and not has("r0 (")(change["reason"]), change["reason"]
        assert not log.events_named("state_lost"), log.events_named("state_lost")
    finally:
        for r in replicas:
            r.stop()
        coordinator.stop()
