"""A replica that arrives after its job finished, end to end: real
coordinator, training processes (tests/ftar_worker.py under fthsdp.agent.training.manager)
and a node agent. The replica is told the job is finished, prints one line
and exits 0; its agent ends as SUCCEEDED without a restart; the operator's
`fthsdp status` shows the mark and `fthsdp reopen-job` clears it.

Needs Manager.start() to catch fthsdp.agent.training.session.job_finished.JobFinished (log the
line, close("finished"), return with ``stopped`` set)."""

from __future__ import annotations

import signal

import pytest

from fthsdp.client import CoordinatorClient
from tests.harness.cli import fthsdp, one_line_error
from tests.harness.events import JsonLog
from tests.harness.processes import AgentProcess, CoordinatorProcess, WorkerProcess
from tests.harness.waiting import wait_until

STEPS = 5


@pytest.fixture
def started():
    procs = []
    yield procs.append
    for proc in procs:
        proc.kill()


@pytest.mark.slow
def test_a_replica_that_arrives_after_the_job_finished_exits_0_and_its_agent_does_not_restart_it(tmp_path, started):
    c = CoordinatorProcess(tmp_path, "--min-replicas", "2", "--heartbeat-interval", "200ms",
                           "--log-format", "json").start()
    events = JsonLog(c.log_path)
    started(c)
    members = [WorkerProcess(tmp_path, c.address, f"r{i}", i, "--steps", str(STEPS), "--wait-for", "2").start()
               for i in range(2)]
    for w in members:
        started(w)
    for w in members:
        assert w.finish()["done"] == STEPS
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: client.status().finished.step == STEPS, 20, message="the job to be marked finished")
    status = fthsdp("status", "--coordinator", c.address)
    assert f"FINISHED at step {STEPS}" in status.stdout, status.stdout

    # A bare process: one line, exit 0, no wait for an admission.
    late = WorkerProcess(tmp_path, c.address, "r2", 2, "--steps", str(STEPS), "--wait-for", "2").start()
    started(late)
    assert late.collect_after_exit(timeout=60) == 0, late.log_tail()
    log = late.log_path.read_text()
    assert log.count(f"job default finished at step {STEPS}") == 1, log
    assert "neither admitted" not in log

    # Under an agent: SUCCEEDED, never a restart.
    agent = AgentProcess(tmp_path, c.address, "r3", 3, 4, "--steps", str(STEPS), "--wait-for", "2").start()
    started(agent)
    assert agent.proc.wait(timeout=60) == 0, agent.log_tail()
    log = agent.log_path.read_text()
    assert f"succeeded (job finished at step {STEPS})" in log and "RESTARTING" not in log, log
    # Never in a quorum, nor admitted by a decision's reason (a quorum's, or one still waiting: no event).
    assert not events.events_named("quorum_change", members=lambda m: bool({"r2", "r3"} & set(m or ())))
    assert not events.find(r"admitting r[23]")

    # Only an operator starts it again, naming the step it saw finish.
    one_line_error(fthsdp("reopen-job", "--coordinator", c.address, "--step", str(STEPS - 1)), 1,
                   f"finished at step {STEPS}, not {STEPS - 1}")
    reopened = fthsdp("reopen-job", "--coordinator", c.address, "--step", str(STEPS))
    assert reopened.returncode == 0 and f"had finished at step {STEPS}" in reopened.stdout, reopened.stderr
    with CoordinatorClient([c.address]) as client:
        assert not client.status().HasField("finished")
    assert events.find_event("job_reopened", job="default", step=STEPS)
    c.signal(signal.SIGTERM)
