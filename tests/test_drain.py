"""A drain drains, with real processes: whoever asks, wherever the replica is.

A drain can be asked for with `fthsdp drain`, the admin endpoint ``POST
/api/replicas/ID/drain``, or SIGTERM to the replica's agent. The
coordinator drops a draining member from the quorum at once (the others
should not wait for it), so the replica may learn that it is out in the
middle of its step or inside the all-reduce, before its step boundary; it
may also be catching up, or waiting for admission. Each time it must end
the same way: ``ft.stopped``, exit 0, its agent ``SUCCEEDED`` with
"(drained)", no restart, and the others train on.
"""

from __future__ import annotations

import os
import signal
import warnings

import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.decisions.status_view import STATE_NAMES
from tests.harness.cli import fthsdp
from tests.harness.events import JsonLog
from tests.harness.fixtures import FOREVER, HIDDEN, TOKEN
from tests.harness.processes import AgentProcess, CoordinatorProcess
from tests.harness.replicas import members, status_of
from tests.harness.waiting import wait_until
from tests.harness.web import drain as http_drain
from tests.harness.web import page_url

SLOW_TRANSFER = {"FTHSDP_CATCH_UP_MAX_RATE": str(1 << 20)}  # 6 MB of state: several seconds


@pytest.fixture
def job(tmp_path, token_file):
    started = []

    def coordinator(min_replicas: int = 2) -> CoordinatorProcess:
        c = CoordinatorProcess(tmp_path, "--min-replicas", str(min_replicas), "--heartbeat-interval", "200ms",
                               "--heartbeat-timeout", "1s", "--join-timeout", "2s", "--metrics-port", "0",
                               "--token-file", token_file).start()
        started.append(c)
        return c

    def agent(c, i: int, n: int, *worker_args: str, env: dict | None = None) -> AgentProcess:
        a = AgentProcess(tmp_path, c.address, f"r{i}", i, n, "--steps", FOREVER, "--wait-for", str(n),
                         "--hidden", HIDDEN, *worker_args, env=env,
                         agent_args=("--token-file", token_file, "--log-format", "json")).start()
        started.append(a)
        return a

    yield coordinator, agent
    for proc in reversed(started):
        proc.stop()


def ask_for_drain(way: str, c: CoordinatorProcess, agent: AgentProcess, token_file: str) -> None:
    replica = agent.replica_id
    if way == "cli":
        out = fthsdp("drain", "--coordinator", c.address, "--token-file", token_file, replica)
        assert out.returncode == 0, out.stderr
    elif way == "http":
        code, body = http_drain(page_url(c), replica, token=TOKEN)
        assert code == 200 and body["drain"] is True, body
    else:
        agent.proc.send_signal(signal.SIGTERM)


def assert_drained(agent: AgentProcess) -> None:
    """The agent ended SUCCEEDED, saying drained, and never restarted the replica."""
    assert agent.exit_code(60) == 0, agent.log_tail(60)
    text = agent.log_path.read_text()
    states = JsonLog(agent.log_path).events_named("agent_state")
    succeeded = [e["detail"] for e in states if e["state"] == "SUCCEEDED"]
    assert succeeded and "drained" in succeeded[0], text[-3000:]
    assert not [e for e in states if e["state"] in ("FAILED", "RESTARTING")], text[-3000:]
    assert "Evicted" not in text, text[-3000:]
    _say_a_death_after_leaving(text)


def _say_a_death_after_leaving(text: str) -> None:
    """A drained rank that then died (SIGABRT in Python's teardown, rare) is
    no failure of the drain, which the agent handles; but it is shown in the
    run's warnings, so that it stays visible until its cause is found, with
    what the rank wrote before it (its stderr is in the agent's log; the
    tests run every process with faulthandler on, which dumps each Python
    thread's stack at the abort)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "after it had left the job" in line:
            before = "\n".join(lines[max(0, i - 60):i])
            warnings.warn(f"a drained rank died after leaving: {line}\nthe agent's log before it:\n{before}",
                          stacklevel=3)


def assert_others_train_on(others, client, drained: str) -> None:
    wait_until(lambda: drained not in members(client), 30, message=f"{drained} out of the quorum")
    for a in others:
        step = a.read_until(lambda line: "step" in line)["step"]
        a.read_until(lambda line, step=step: line.get("step", 0) >= step + 5, timeout=60)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("way, where", [
    ("cli", "allreduce"),
    ("http", "computing"),
    ("agent", "allreduce"),
    pytest.param("cli", "computing", marks=pytest.mark.slow),
    pytest.param("http", "allreduce", marks=pytest.mark.slow),
    pytest.param("agent", "computing", marks=pytest.mark.slow),
])
def test_a_member_drained_mid_step_leaves_cleanly(job, token_file, way, where):
    """``where``: the drained replica spends its steps computing (the others
    wait for it), or waiting in the all-reduce (the others compute slowly),
    so that the request lands there."""
    coordinator, agent = job
    c = coordinator()
    slow = ("--slow", "0.15")
    agents = [agent(c, i, 3, *(slow if (i == 1) == (where == "computing") else ())) for i in range(3)]
    a0, a1, a2 = agents
    a1.read_until(lambda line: line.get("step", 0) >= 5)
    with CoordinatorClient([c.address], token=TOKEN) as client:
        ask_for_drain(way, c, a1, token_file)
        done = a1.read_until(lambda line: "done" in line)
        assert done["stopped"] is True
        assert_drained(a1)
        assert_others_train_on((a0, a2), client, "r1")
        _, r1 = status_of(client, "r1")
        assert r1 is None or r1.restart_count == 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("way", ["cli", pytest.param("agent", marks=pytest.mark.slow)])
def test_a_replica_drained_while_it_catches_up_leaves_cleanly(job, token_file, way):
    coordinator, agent = job
    c = coordinator()
    a0, a1, a2 = (agent(c, i, 3, env=SLOW_TRANSFER) for i in range(3))
    first = a2.read_until(lambda line: "admitted" in line)
    a0.read_until(lambda line: line.get("step", 0) >= 10)
    os.kill(first["pid"], signal.SIGKILL)
    with CoordinatorClient([c.address], token=TOKEN) as client:
        def catching_up() -> bool:
            _, r2 = status_of(client, "r2")
            return r2 is not None and r2.restart_count == 1 and STATE_NAMES[r2.state] == "catching-up"

        wait_until(catching_up, 60, interval=0.05, message="the restarted r2 catching up")
        ask_for_drain(way, c, a2, token_file)
        assert_drained_after_one_restart(a2)
        assert_others_train_on((a0, a1), client, "r2")


def assert_drained_after_one_restart(agent: AgentProcess) -> None:
    assert agent.exit_code(60) == 0, agent.log_tail(60)
    text = agent.log_path.read_text()
    states = JsonLog(agent.log_path).events_named("agent_state")
    succeeded = [e["detail"] for e in states if e["state"] == "SUCCEEDED"]
    assert succeeded and "drained" in succeeded[-1], text[-3000:]
    assert [e["state"] for e in states].count("RESTARTING") == 1, "only the kill restarts it"
    assert "Evicted" not in text, text[-3000:]
    _say_a_death_after_leaving(text)


@pytest.mark.timeout(120)
def test_a_replica_drained_while_it_waits_for_admission_leaves_cleanly(job, token_file):
    """The first replica of a job of two waits for the second: drained meanwhile, it leaves."""
    coordinator, agent = job
    c = coordinator()
    a0 = agent(c, 0, 2)
    with CoordinatorClient([c.address], token=TOKEN) as client:
        wait_until(lambda: status_of(client, "r0")[1] is not None, 30, message="r0 registered")
        ask_for_drain("http", c, a0, token_file)
        assert_drained(a0)
