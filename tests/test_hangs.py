"""Hangs and stragglers with real processes (fthsdp/coordinator/decisions/hang.py).

A replica whose training thread blocks forever (its heartbeat threads
alive) is taken out once the others have waited for it past the hang limit;
the waiting replicas go on among themselves (never time out and leave), and
under `fthsdp agent` the hung one is ended after a stack dump, restarted,
and catches up. Tight settings here (floor 3 s, 3 x the median step); the
defaults and what they cost are in docs/design.md, "Hangs and stragglers".
"""

from __future__ import annotations

import os
import signal

import pytest

from fthsdp.client import CoordinatorClient
from tests.harness.events import JsonLog, has, like
from tests.harness.processes import CoordinatorProcess, WorkerProcess
from tests.harness.replicas import (
    HANG_FLOOR,
    LONG_FTAR,
    SLOW,
    TIGHT,
    assert_one_state_per_step,
    members,
    status_of,
    train_on_and_stop,
    wait_transfer_started,
)
from tests.harness.waiting import wait_until

"""The floor of the hang limit here. A replica is blamed once it has made no
progress for the limit, and the steps here take milliseconds, so the floor
is the limit: the longest a healthy process may go unscheduled. On a busy
2-core machine (a dozen training processes of these tests beside others')
a second happens, most of all in a group's first step after it rejoins; the
product's default floor (10 s) is never near that tight."""
HEARTBEAT_TIMEOUT = "2s"
"""Of the bare workers: long enough that a loaded machine's pause in a healthy
worker's heartbeat thread does not drop it (the product's default is 5 s)."""
HANG_AT = 5


@pytest.fixture
def bare(tmp_path):
    started = []

    def start(n, victim_args=(), coordinator_args=TIGHT, steps=30, env=LONG_FTAR):
        c = CoordinatorProcess(tmp_path, "--min-replicas", "1", "--heartbeat-interval", "200ms",
                               "--heartbeat-timeout", HEARTBEAT_TIMEOUT, "--log-format", "json",
                               *coordinator_args).start()
        started.append(c)
        workers = []
        for i in range(n):
            extra = victim_args if i == n - 1 else ()
            w = WorkerProcess(tmp_path, c.address, f"r{i}", i, "--steps", str(steps), "--wait-for", str(n),
                              *extra, env=env).start()
            started.append(w)
            workers.append(w)
        return c, workers

    yield start
    for proc in started:
        proc.signal(signal.SIGCONT)
        proc.kill()


def assert_every_step_once(survivors, steps):
    for w in survivors:
        assert sorted(w.steps) == list(range(1, steps + 1)), f"{w.replica_id} lost or repeated a step"
    assert_one_state_per_step(*survivors)


@pytest.mark.parametrize("where", ["data", "backward", "update"])
def test_survivors_go_on_past_a_replica_that_hangs(bare, where):
    c, (r0, r1, r2) = bare(3, ("--hang-at", str(HANG_AT), "--hang-in", where))
    r2.read_until(lambda line: "hanging" in line)
    for w in (r0, r1):
        w.finish()
    assert_every_step_once([r0, r1], 30)
    # The step the hung replica never finished was committed by the two others.
    failing = HANG_AT + 1 if where != "update" else HANG_AT + 2
    assert r0.steps[failing]["contributors"] == 2, r0.steps[failing]
    gap = r0.steps[failing]["t"] - r0.steps[failing - 1]["t"]
    assert gap < HANG_FLOOR + 5.0, f"the survivors waited {gap:.1f}s for a verdict the limit puts at {HANG_FLOOR:g} s"
    assert JsonLog(c.log_path).find_event("hang", replica="r2", reason=like(r"^hung: no progress at step"))
    # The hung process dumped its stacks: the training thread is in hang().
    text = r2.log_path.read_text()
    assert "taken out by the coordinator" in text and "in hang" in text
    assert r2.proc.poll() is None  # still blocked: without an agent nobody ends it


def test_members_wait_past_their_ftar_timeout_for_the_verdict(bare):
    """FTHSDP_FTAR_TIMEOUT 2 s, a hang limit of 4 s: the waiting members
    would time out first and leave the hung one alone in the quorum; they
    wait for the coordinator's verdict instead (its push says how long)."""
    c, (r0, r1, r2) = bare(3, ("--hang-at", str(HANG_AT)), coordinator_args=("--hang-floor", "4s"),
                           env={"FTHSDP_FTAR_TIMEOUT": "2"})
    for w in (r0, r1):
        w.finish()
    assert_every_step_once([r0, r1], 30)
    assert r0.steps[HANG_AT + 1]["contributors"] == 2
    assert "FtarTimeout" not in r0.log_path.read_text()


def test_a_marked_section_longer_than_the_limit_is_no_hang(bare):
    c, (r0, r1, r2) = bare(3, ("--section-at", str(HANG_AT), "--section-s", str(HANG_FLOOR + 2)))
    for w in (r0, r1, r2):
        w.finish()
    assert_every_step_once([r0, r1, r2], 30)
    assert all(w.steps[s]["contributors"] == 3 for w in (r0, r1, r2) for s in w.steps)
    assert not JsonLog(c.log_path).taken_out()


@pytest.mark.slow
def test_a_section_past_its_own_timeout_is_a_hang(bare):
    c, (r0, r1, r2) = bare(3, ("--hang-at", str(HANG_AT), "--hang-in", "section"),
                           coordinator_args=("--hang-floor", "30s"))
    for w in (r0, r1):
        w.finish()
    assert r0.steps[HANG_AT + 1]["contributors"] == 2
    assert JsonLog(c.log_path).find_event("hang", replica="r2", reason=has("in section 'stuck'"))


def restarted_and_back(c, victims, timeout=90):
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1", "r2"}
                   and all(status_of(client, r)[1].restart_count >= 1 for r in victims),
                   timeout, message=f"{', '.join(victims)} restarted, caught up and back in the quorum")




def test_a_hung_replica_is_ended_by_its_agent_restarted_and_caught_up(cluster):
    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "1", "--log-format", "json", *TIGHT)
    r0, r1 = (agent(c, i, 3, env=LONG_FTAR) for i in range(2))
    r2 = agent(c, 2, 3, "--hang-at", "20", env=LONG_FTAR, agent_args=("--hang-grace", "1s"))
    hung_pid = r2.read_until(lambda line: "hanging" in line)["hanging"]
    restarted_and_back(c, ["r2"], timeout=60)
    with pytest.raises(ProcessLookupError):
        os.kill(hung_pid, 0)  # the hung process is gone
    train_on_and_stop([r0, r1, r2], more=10)
    assert "taken out by the coordinator (hung" in r2.log_path.read_text()


def test_a_stopped_rank_is_killed_by_its_agent_and_restarted(cluster):
    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "1", "--log-format", "json", *TIGHT)
    r0, r1, r2 = (agent(c, i, 3, env=LONG_FTAR, agent_args=("--hang-grace", "1s")) for i in range(3))
    pid = r2.read_until(lambda line: "admitted" in line)["pid"]
    r0.read_until(lambda line: line.get("step", 0) >= 10)
    os.kill(pid, signal.SIGSTOP)
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1"}, 20, message="the stopped replica taken out")
    restarted_and_back(c, ["r2"], timeout=60)
    train_on_and_stop([r0, r1, r2])
    assert "no heartbeat" in r2.log_path.read_text()


def rank_pids(agent) -> list[int]:
    """The agent's child processes (its ranks), from /proc."""
    pid = agent.proc.pid
    text = open(f"/proc/{pid}/task/{pid}/children").read()
    return [int(x) for x in text.split()]


def test_a_joiner_stopped_while_it_catches_up_is_ended_by_its_agent_and_restarted(cluster):
    """SIGSTOP of a restarted replica's rank in the middle of its snapshot
    transfer: it is no member, so no quorum drops it and nobody waits for it;
    its heartbeats stop with its session open, the coordinator tells its
    agent, which ends it, and the next incarnation catches up and rejoins."""
    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "1", "--log-format", "json", *TIGHT)
    r0, r1, r2 = (agent(c, i, 3, env={**LONG_FTAR, **SLOW}, agent_args=("--hang-grace", "1s")) for i in range(3))
    os.kill(r2.read_until(lambda line: "admitted" in line)["pid"], signal.SIGKILL)
    r0.read_until(lambda line: line.get("step", 0) >= 10)
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: status_of(client, "r2")[1].restart_count >= 1, 30, message="r2 restarted")
        wait_transfer_started(client, "r2")
        (pid,) = rank_pids(r2)
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: status_of(client, "r2")[1].restart_count >= 2, 30,
                   message="the stopped joiner ended by its agent and restarted")
        assert members(client) == {"r0", "r1"}
    restarted_and_back(c, ["r2"], timeout=90)
    train_on_and_stop([r0, r1, r2])
    log = JsonLog(c.log_path)
    assert log.find_event("silent", replica="r2", reason=like(
        r"^no heartbeat for 1s while outside the quorum, catching up")), log.tail()


def test_a_straggler_is_taken_out_and_cordoned_under_the_policy(bare):
    c, (r0, r1, r2) = bare(3, ("--slow", "0.15"), coordinator_args=(
        "--straggler-multiple", "3", "--straggler-steps", "8", "--hang-floor", "5s"), steps=60)
    for w in (r0, r1):
        w.finish(timeout=120)
    assert_every_step_once([r0, r1], 60)
    assert r0.steps[60]["contributors"] == 2
    assert JsonLog(c.log_path).find_event("straggler", replica="r2", reason=like(r"^straggler: compute"))
    assert r2.collect_after_exit() != 0  # it learned it was out at its next step, and ended
    assert "does not include this replica" in r2.log_path.read_text()


def test_a_rank_of_an_fsdp2_group_hung_takes_the_group_out(cluster, tmp_path):
    """Three replica groups of 2 FSDP2 ranks; rank 1 of r2 blocks before its
    forward pass, so its rank 0 waits forever inside FSDP's all-gather:
    neither reaches the all-reduce, the other groups wait for both, and the
    group is taken out as a whole, ended by its agent and restarted."""
    from tests.harness.processes import AgentProcess

    coordinator, _, _ = cluster
    c = coordinator("--min-replicas", "1", "--log-format", "json", *TIGHT)
    groups = [
        AgentProcess(tmp_path, c.address, f"r{k}", k, 3, "--steps", "1000000", "--hidden", "64", "--wait-for", "3",
                     *(("--hang-at", "10") if k == 2 else ()),
                     agent_args=("--nproc", "2", "--hang-grace", "1s"), worker="tests.hsdp_worker",
                     env=LONG_FTAR).start()
        for k in range(3)
    ]
    try:
        groups[2].read_until(lambda line: "hanging" in line)
        restarted_and_back(c, ["r2"])
        train_on_and_stop(groups)
    finally:
        for g in groups:
            g.stop()
    assert JsonLog(c.log_path).find_event("hang", replica="r2", reason=like(r"^hung"))


@pytest.mark.slow
def test_a_source_that_hangs_while_a_replica_catches_up_from_it(cluster):
    """r2 is killed and restarted; while it fetches its snapshot, its source
    hangs. The source is taken out and ended, the other member trains on,
    and both come back (from the member left) with one state per step."""
    from tests.harness.replicas import SLOW

    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "1", "--log-format", "json", *TIGHT)
    workers = [agent(c, i, 3, "--hang-on-signal", env={**SLOW, **LONG_FTAR}, agent_args=("--hang-grace", "1s"))
               for i in range(3)]
    pids = {w.replica_id: w.read_until(lambda line: "admitted" in line)["pid"] for w in workers}
    workers[0].read_until(lambda line: line.get("step", 0) >= 10)
    os.kill(pids["r2"], signal.SIGKILL)
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: status_of(client, "r2")[1].catch_up_bytes > 0, 60, interval=0.01,
                   message="r2 catching up")
        source = status_of(client, "r2")[1].catch_up_source
    os.kill(pids[source], signal.SIGUSR1)
    other = next(w for w in workers[:2] if w.replica_id != source)
    hung = next(w for w in workers if w.replica_id == source)
    before = other.read_until(lambda line: "step" in line)["step"]
    other.read_until(lambda line: line.get("step", 0) >= before + 20, timeout=30)  # never stalls for good
    restarted_and_back(c, ["r2", source], timeout=120)
    train_on_and_stop([other] + [w for w in workers if w is not other])  # the one that never failed first
    assert JsonLog(c.log_path).find_event("hang", replica=source, reason=like(r"^hung"))
    assert "taken out by the coordinator (hung" in hung.log_path.read_text()
