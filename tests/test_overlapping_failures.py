"""Failures that overlap, with real processes (the loop of ftar_worker --loop full).

What must hold in each case (docs/design.md, "Failures that overlap"): the
survivors commit on without waiting out a timeout, the lost replicas come
back and catch up, every step a replica commits has one state on every
replica that committed it, and no committed step is lost or redone with
another state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from fthsdp.client import CoordinatorClient
from tests.harness.cli import fthsdp
from tests.harness.processes import AgentProcess
from tests.harness.replicas import SLOW, assert_one_state_per_step, members, status_of
from tests.harness.waiting import wait_until

LOOP = ("--loop", "full")




def test_two_of_three_killed_at_once(cluster):
    """Two of three replicas' ranks SIGKILLed within 100 ms under `fthsdp
    agent`: their agents report the deaths, so the coordinator shrinks at
    once (no split-brain wait, although a majority is gone: --join-timeout is
    30 s here) and the survivor commits alone within a few seconds; both are
    restarted, catch up and train with it, bit-identical."""
    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "1", "--join-timeout", "30s")
    r0, r1, r2 = (agent(c, i, 3, *LOOP, "--hidden", "256", env=SLOW) for i in range(3))
    pids = [w.read_until(lambda line: "admitted" in line)["pid"] for w in (r1, r2)]
    r0.read_until(lambda line: line.get("step", 0) >= 12)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    alone = r0.read_until(lambda line: line.get("contributors") == 1, timeout=60)
    assert alone["t"] - killed < 5.0, f"the survivor's first step alone came {alone['t'] - killed:.1f}s after the kills"
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1", "r2"}
                   and all(status_of(client, r)[1].restart_count >= 1 for r in ("r1", "r2")),
                   90, message="both killed replicas restarted and back in the quorum")
    last = r0.read_until(lambda line: "step" in line)["step"]
    for w in (r0, r1, r2):
        w.read_until(lambda line: line.get("step", 0) >= last + 10, timeout=60)
    for w in (r0, r1, r2):
        w.stop()
        w.collect_after_exit()
    assert_one_state_per_step(r0, r1, r2)
    steps = sorted(set(r0.steps) | set(r1.steps) | set(r2.steps))
    assert steps == list(range(steps[0], steps[-1] + 1)), "a committed step is missing"


def second_of_two_restarted(coordinator, worker):
    """Two replicas train; r1 is SIGKILLed, taken out, and started again."""
    c = coordinator("--min-replicas", "1")
    r0, r1 = (worker(c, i, 2, *LOOP) for i in range(2))
    r0.read_until(lambda line: line.get("step", 0) >= 12)
    r1.kill()
    r1.collect_after_exit()
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0"}, 20, message="r1 taken out")
    return c, r0, r1, worker(c, 1, 1, *LOOP, name="r1-back")


def test_last_member_killed_after_a_joiner_trained_with_it(cluster):
    """The only up-to-date member dies once a returning replica has trained a
    step with it: the joiner holds the committed state, so it is a full
    member and trains on alone; the killed one comes back and catches up
    from it. No step has two states, none is missing."""
    coordinator, _, worker = cluster
    c, r0, r1, joiner = second_of_two_restarted(coordinator, worker)
    with CoordinatorClient([c.address]) as client:
        first = joiner.read_until(lambda line: "step" in line, timeout=60)["step"]  # trained with r0
        r0.kill()
        r0.collect_after_exit()
        wait_until(lambda: members(client) == {"r1"}, 20, message="r0 taken out")
    joiner.read_until(lambda line: line.get("step", 0) >= first + 5 and line.get("contributors") == 1, timeout=60)
    r0_back = worker(c, 0, 1, *LOOP, name="r0-back")
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1"}, 60, message="r0 back in the quorum")
    r0_back.read_until(lambda line: "step" in line, timeout=60)
    last = r0_back.read_until(lambda line: "step" in line, timeout=60)["step"]
    joiner.read_until(lambda line: line.get("step", 0) >= last + 5, timeout=60)
    for w in (joiner, r0_back):  # drained: every step they printed is read
        w.stop()
        w.collect_after_exit()
    assert_one_state_per_step(r0, r1, joiner, r0_back)
    steps = sorted(set(r0.steps) | set(joiner.steps) | set(r0_back.steps))
    assert steps == list(range(steps[0], steps[-1] + 1)), (
        f"a committed step is missing: r0 {min(r0.steps)}..{max(r0.steps)}, r1 back {min(joiner.steps)}.."
        f"{max(joiner.steps)}, r0 back {min(r0_back.steps)}..{max(r0_back.steps)}"
    )


def source_of(joiner) -> str:
    """The source the joiner's log names last ("catching up from rX")."""
    found = [line.split("catching up from ")[1].split()[0] for line in joiner.log_path.read_text().splitlines()
             if "catching up from " in line]
    return found[-1] if found else ""


def kill_source_when(coordinator, worker, mark: str, *joiner_args: str, member_args: tuple[str, ...] = ()):
    """Three replicas, r2 killed and restarted; its source is SIGKILLed as
    soon as the joiner's log shows ``mark``. The joiner must get another
    source within seconds, without a restart (a plain worker: it would
    exit), and the remaining member must never crash."""
    c = coordinator("--min-replicas", "1")
    workers = [worker(c, i, 3, *LOOP, *member_args) for i in range(3)]
    workers[0].read_until(lambda line: line.get("step", 0) >= 12)
    workers[2].kill()
    workers[2].collect_after_exit()
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1"}, 20, message="r2 taken out")
        joiner = worker(c, 2, 1, *LOOP, *joiner_args, name="r2-back")
        wait_until(lambda: mark in joiner.log_path.read_text(), 60, interval=0.002,
                   message=f"the joiner's log shows {mark!r}")
        source = source_of(joiner)
        victim, other = (workers[0], workers[1]) if source == "r0" else (workers[1], workers[0])
        victim.kill()
        killed = time.monotonic()
        victim.collect_after_exit()
        wait_until(lambda: members(client) == {other.replica_id, "r2"}, 30,
                   message="the joiner admitted from another source")
        admitted_after = time.monotonic() - killed
    assert admitted_after < 20, f"the joiner was admitted {admitted_after:.1f}s after its source died"
    assert other.proc.poll() is None, "the remaining member crashed"
    last = other.read_until(lambda line: "step" in line)["step"]
    joiner.read_until(lambda line: line.get("step", 0) >= last + 5, timeout=60)
    for w in (other, joiner):
        w.stop()
        w.collect_after_exit()
    assert_one_state_per_step(victim, other, joiner)
    return joiner


def test_source_killed_during_the_replay(cluster):
    coordinator, _, worker = cluster
    joiner = kill_source_when(coordinator, worker, "loaded the snapshot", "--replay-delay", "0.2")
    assert len({line for line in joiner.log_path.read_text().splitlines() if "catching up from" in line}) >= 2


def test_source_killed_during_the_admission(cluster):
    """Admitted, the joiner takes its first step in the quorum inside
    start(), closing its last gap from its source's log while the members
    arrive (slow steps here, so that the kill lands inside that step): it
    closes the gap from the next source the coordinator names instead."""
    coordinator, _, worker = cluster
    joiner = kill_source_when(coordinator, worker, "admitted in quorum", member_args=("--slow", "0.4"))
    text = joiner.log_path.read_text()
    assert "was lost during the last gap" in text, text[-3000:]
    assert "StateNotHeld" not in text


@pytest.mark.slow
def test_a_rank_of_an_fsdp2_group_killed_while_another_group_catches_up(cluster, tmp_path):
    """Three replica groups of 2 FSDP2 ranks. A rank of r2 is SIGKILLed; while
    r2's group catches up (shard by shard), a rank of r1 is SIGKILLed too.
    Both groups are restarted by their agents, catch up from the groups left
    and rejoin; one state per committed step."""
    coordinator, _, _ = cluster
    c = coordinator("--min-replicas", "1")
    groups = [
        AgentProcess(tmp_path, c.address, f"r{k}", k, 3, "--steps", "1000000", "--hidden", "256", "--wait-for", "3",
                     agent_args=("--nproc", "2", "--max-restarts", "10"), worker="tests.hsdp_worker",
                     env={"FTHSDP_CATCH_UP_MAX_RATE": str(1 << 20)}).start()
        for k in range(3)
    ]
    try:
        pids = [{}, {}, {}]
        for k in (1, 2):
            groups[k].read_until(lambda line, k=k: "rank" in line
                                 and pids[k].update({line["rank"]: line["pid"]}) is None and len(pids[k]) == 2)
        groups[0].read_until(lambda line: line.get("step", 0) >= 10)
        os.kill(pids[2][1], signal.SIGKILL)
        with CoordinatorClient([c.address]) as client:
            wait_until(lambda: status_of(client, "r2")[1].catch_up_bytes > 0, 60, interval=0.01,
                       message="r2's group catching up")
            os.kill(pids[1][1], signal.SIGKILL)
            wait_until(lambda: members(client) == {"r0", "r1", "r2"}
                       and all(status_of(client, r)[1].restart_count >= 1 for r in ("r1", "r2")),
                       120, message="both groups restarted, caught up and back in the quorum")
        last = groups[0].read_until(lambda line: "step" in line)["step"]
        for g in groups:
            g.read_until(lambda line: line.get("step", 0) >= last + 5, timeout=60)
    finally:
        for g in groups:
            g.stop()
    for g in groups:
        g.collect_after_exit()
    assert_one_state_per_step(*groups)


def give_up(c, step: int) -> subprocess.CompletedProcess:
    return fthsdp("give-up-state", "--coordinator", c.address, "--step", str(step))


@pytest.mark.parametrize("back", [2, 1])
def test_every_holder_lost_the_job_waits_until_an_operator_gives_the_state_up(cluster, back):
    """Both training replicas SIGKILLed at once: fresh replicas (at step 0)
    are not let start over; status says the state was lost at step N and
    they wait (no timeout); `fthsdp give-up-state` with another step is
    refused, with N it lets them train from the start. ``back``: how many
    come back, running the same command (``start(wait_for_replicas=2)``):
    one alone trains too, as the coordinator's --min-replicas 1 allows (the
    script's wait is for a fresh job's start)."""
    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "1")
    r0, r1 = (worker(c, i, 2, *LOOP) for i in range(2))
    r0.read_until(lambda line: line.get("step", 0) >= 30)
    r0.kill()
    r1.kill()
    for w in (r0, r1):
        w.collect_after_exit()
    reached = max(max(r0.steps), max(r1.steps))
    fresh = [worker(c, i, 2, *LOOP, name=f"r{i}-fresh") for i in range(back)]
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: client.status().state_lost_step > 0 and len(client.status().replicas) >= back
                   and all("the job's state was lost" in f.log_path.read_text() for f in fresh),
                   60, message="the state reported lost and the fresh replicas waiting")
        status = client.status()
        lost = status.state_lost_step
        # A replica prints a step after commit() returns, and reports it from inside commit(): one
        # killed in between had committed (and reported) a step more than it printed.
        assert 0 < lost <= reached + 1 and "no live replica holds it" in status.state_lost_reason
        assert not status.quorum.members or members(client) <= {"r0", "r1"} and not any(
            "step" in line for f in fresh for line in f.history)
        refused = give_up(c, lost - 1)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert not any('"step"' in line for f in fresh for line in f.history)
        accepted = give_up(c, lost)
        assert accepted.returncode == 0, accepted.stderr
        wait_until(lambda: client.status().state_lost_step == 0, 20, message="the state no longer reported lost")
    firsts = [f.read_until(lambda line: "step" in line, timeout=60)["step"] for f in fresh]
    assert firsts == [1] * back, f"after the give-up the job starts over from step 0: first steps {firsts}"


def test_last_member_killed_as_a_joiner_is_admitted(cluster):
    """The only up-to-date member dies right as a returning replica is
    admitted, before they trained a step together. The joiner either
    provably reached the member's state (it saw their step and replayed to
    it), then trains on alone; or it did not, then it leaves (StateNotHeld)
    and the job waits with its state lost, never starting over silently.
    Either way no step has two states."""
    coordinator, _, worker = cluster
    c, r0, r1, joiner = second_of_two_restarted(coordinator, worker)
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1"}, 60, interval=0.002, message="r1 admitted again")
        r0.kill()
        r0.collect_after_exit()
        wait_until(lambda: joiner.proc.poll() is not None or any(
            line.get("contributors") == 1 for line in joiner.steps.values()) or client.status().state_lost_step,
            30, interval=0.05, message="the joiner went on alone or left")
        if joiner.proc.poll() is None and not client.status().state_lost_step:
            last = joiner.read_until(lambda line: "step" in line)["step"]
            joiner.read_until(lambda line: line.get("step", 0) >= last + 5)
        else:
            wait_until(lambda: joiner.proc.poll() is not None, 30, message="the joiner that lacks the state leaves")
            assert "StateNotHeld" in joiner.log_path.read_text()
            wait_until(lambda: client.status().state_lost_step > 0, 30, message="the job's state reported lost")
    joiner.stop()
    joiner.collect_after_exit()
    assert_one_state_per_step(r0, r1, joiner)
