"""A replica whose loop diverges after every catch-up, end to end: real
coordinator, training processes (tests/ftar_worker.py --lr-from-counter: the
learning rate comes from a counter of the loop's own, which restarts at 0
with the process) and a node agent. The rejoined replica is taken out with
a message naming its learning rate against the members'; the second time
in a row its agent gives up instead of restarting it a third time, and
`fthsdp status` says so.

Needs Manager.commit() to pass the step's inputs to the checksum history
(``self._history.record(self.step, checksum, self._inputs.hyperparams_json)``);
without them the message says that no inputs were reported."""

from __future__ import annotations

import pytest

from tests.harness.cli import fthsdp
from tests.harness.events import JsonLog
from tests.harness.processes import AgentProcess, CoordinatorProcess, WorkerProcess

WORKER = ("--steps", "100000", "--wait-for", "3", "--hidden", "32", "--slow", "0.02", "--lr-from-counter")


@pytest.fixture
def started():
    procs = []
    yield procs.append
    for proc in procs:
        proc.kill()


@pytest.mark.slow
def test_a_replica_that_diverges_after_each_catch_up_is_given_up_with_the_reason(tmp_path, started):
    c = CoordinatorProcess(tmp_path, "--min-replicas", "2", "--heartbeat-interval", "200ms",
                           "--heartbeat-timeout", "2s", "--log-format", "json").start()
    started(c)
    for i in range(2):
        started(WorkerProcess(tmp_path, c.address, f"r{i}", i, *WORKER).start())
    agent = AgentProcess(tmp_path, c.address, "r2", 2, 3, *WORKER, "--die-at", "30",
                         agent_args=("--max-restarts", "5", "--log-format", "json"))
    started(agent)
    agent.start()
    assert agent.proc.wait(timeout=240) == 1, agent.log_tail(60)
    log = agent.log_path.read_text()
    states = JsonLog(agent.log_path)
    # The crash at step 30, then the first mismatch; not the second.
    assert len(states.events_named("agent_state", replica="r2", state="RESTARTING")) == 2, log
    gave_up = [e["detail"] for e in states.events_named("agent_state", replica="r2", state="GAVE_UP")]
    assert len(gave_up) == 1 and "gave up: r2's lr at step" in gave_up[0] and "the members'" in gave_up[0], gave_up
    assert "2 times in a row after catching up" in gave_up[0]
    # The training process was told why it was taken out (its Evicted): its own output, not a log record.
    assert "does not include this replica: checksum mismatch: r2's lr at step" in log
    flagged = JsonLog(c.log_path).events_named("checksum_mismatch")
    assert len(flagged) == 2 and all(e["replica"] == "r2" and "r2's lr at step" in e["reason"] for e in flagged), \
        flagged
    assert flagged[-1]["give_up"] is True  # "its agent gives up"
    status = fthsdp("status", "--coordinator", c.address).stdout
    assert "r2 checksum mismatch (2 in a row after catching up): r2's lr at step" in status, status
    assert "r2 GAVE UP (its agent does not restart it): gave up: r2's lr at step" in status, status
