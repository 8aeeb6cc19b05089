"""Network faults with real processes in network namespaces (tests/harness/netns.py).

Each replica runs under `fthsdp agent` in a namespace of its own, with a
control link to the coordinator's bridge and a data link (its gloo traffic
and catch-up) to another. The faults are the network's own: a link set
down, a route blackholed between two replicas only, a token-bucket rate
limit. Each test asserts what the soak asserts: no committed step lost, one
state per step, nobody started over, and no healthy replica taken out.

They need root and iproute2 (CI has both); elsewhere they skip, saying why.
"""

from __future__ import annotations

import re
import time

import pytest

from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.events import has, like
from tests.harness.netjob import Job, assert_no_step_lost, assert_one_state_per_step, jobs_in_lab
from tests.harness.waiting import wait_until


def reprobes(job: Job, name: str) -> list[str]:
    """The probes a replica answered that it could not reach everyone (its rank's log)."""
    return re.findall(rf"replica {name} rank 0: probe (\d+): cannot reach",
                      job.agents[name].log_path.read_text(errors="replace"))


@pytest.fixture
def job_in_lab(tmp_path, etcd_url, key_prefix):
    with jobs_in_lab(tmp_path, etcd_url, key_prefix) as make:
        yield make


@pytest.mark.timeout(300)
def test_a_down_data_link_takes_out_that_replica_only_and_it_rejoins_once_healed(job_in_lab):
    """r2's data link goes down while every process lives and heartbeats over
    its control link. The stuck collective is regrouped, then probed; r2 is
    taken out as unreachable from r0 and r1, which commit the step and train
    on. r2 is restarted once, and waits, kept out ("unreachable from r0,
    r1" in status), not restarted in a loop; once its link is back it
    catches up and trains with the same state."""
    job = job_in_lab()
    lab = job.lab
    head = job.training(lab.names, contributors=3, steps=20, timeout=120)
    cut_at = time.monotonic()
    lab.cut_data("r2")
    job.log.wait_event("stuck_regroup", 30, reason=like(
        r"all 3 members have waited [\d.]+s in the all-reduce of step \d+ .*regrouping"))
    job.log.wait_event("unreachable", 40, replica="r2", reason=has("unreachable from r0, r1 over the data path"))
    after = job.training(["r0", "r1"], contributors=2, past=head, steps=10, timeout=60)
    stall = first_step_with(job, "r0", 2, head)["t"] - cut_at
    assert not job.log.taken_out("r0", "r1"), "a healthy member was taken out"
    # r2 waits, kept out, saying why; its agent restarted it once (the eviction), not in a loop.
    def kept_out() -> bool:
        r2 = job.status()["r2"]
        return (r2.restart_count == 1 and r2.state == pb.REPLICA_STATE_JOINING and r2.heartbeat_age_s >= 0
                and "unreachable from r0, r1" in r2.unreachable)

    wait_until(kept_out, timeout=60, interval=0.2, message="r2 restarted once and shown as kept out in status")
    probes_before = len(reprobes(job, "r2"))
    wait_until(lambda: len(reprobes(job, "r2")) >= probes_before + 3, timeout=60, interval=0.2,
               message="r2, kept out, probing the members again and again")
    assert kept_out(), "r2 was restarted again, or let back, while its link is down"
    assert not job.log.events_named("reachable"), "r2 was let back while its link is down"
    lab.heal_data("r2")
    job.log.wait_event("reachable", 30, replica="r2")
    back = job.agents["r2"].read_until(lambda line: "admitted" in line and line.get("catch_up"), timeout=120)
    job.training(["r2"], contributors=3, past=after, steps=20, timeout=120)
    assert back["catch_up"] is not None
    assert_one_state_per_step(job)
    assert_no_step_lost(job, ["r0", "r1"])
    print(f"stall after the cut: {stall:.1f}s")


def assert_nobody_taken_out(job: Job) -> None:
    """Nobody was taken out or restarted, every replica committed every step, with one state."""
    assert not job.log.taken_out(), job.coordinator.log_tail()
    assert all(r.restart_count == 0 for r in job.status().values()), "a replica was restarted"
    assert_one_state_per_step(job)
    assert_no_step_lost(job, job.lab.names)


def first_step_with(job: Job, name: str, contributors: int, past: int) -> dict:
    steps = job.agents[name].steps
    return steps[min(s for s in steps if s > past and steps[s]["contributors"] == contributors)]


@pytest.mark.timeout(300)
def test_a_cut_between_two_replicas_takes_out_one_of_them_only(job_in_lab):
    """r0 and r1 cannot reach each other; each still reaches r2. The largest
    set that all reach one another has two members: r0 and r2 (the lowest
    ids) train on, r1 waits, "unreachable from r0", until the cut heals."""
    job = job_in_lab()
    lab = job.lab
    head = job.training(lab.names, contributors=3, steps=20, timeout=120)
    lab.cut_pair("r0", "r1")
    job.log.wait_event("unreachable", 60, replica="r1", reason=has("unreachable from r0 over the data path"))
    after = job.training(["r0", "r2"], contributors=2, past=head, steps=10, timeout=60)
    assert not job.log.taken_out("r0", "r2"), "a member that reaches the others was taken out"
    wait_until(lambda: "unreachable from r0 " in job.status()["r1"].unreachable, timeout=60, interval=0.2,
               message="r1 shown as kept out, unreachable from r0")
    lab.heal_pair("r0", "r1")
    job.log.wait_event("reachable", 30, replica="r1")
    job.training(["r1"], contributors=3, past=after, steps=20, timeout=120)
    assert_one_state_per_step(job)
    assert_no_step_lost(job, ["r0", "r2"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_flapping_data_link_takes_nobody_out(job_in_lab):
    """r2's data link is down for 2 s, then back: the collectives resume (by
    themselves, or in a regrouped group), nobody is taken out or restarted."""
    job = job_in_lab()
    lab = job.lab
    head = job.training(lab.names, contributors=3, steps=20, timeout=120)
    lab.flap_data("r2", 2.0, wait=True)
    job.training(lab.names, contributors=3, past=head + 5, steps=30, timeout=90)
    assert_nobody_taken_out(job)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_slow_data_link_is_not_a_down_link(job_in_lab):
    """r2's data link is rate-limited (tbf): every step takes longer, since
    every member waits for it, but each makes progress; nobody is taken out."""
    job = job_in_lab()
    lab = job.lab
    head = job.training(lab.names, contributors=3, steps=20, timeout=120)
    before = job.agents["r0"].steps[head]["t"] - job.agents["r0"].steps[head - 10]["t"]
    lab.limit_rate("r2", rate="2mbit")
    slow = job.training(lab.names, contributors=3, past=head + 2, steps=20, timeout=120)
    during = job.agents["r0"].steps[slow]["t"] - job.agents["r0"].steps[slow - 10]["t"]
    lab.unlimit("r2")
    job.training(lab.names, contributors=3, past=slow, steps=10, timeout=60)
    assert during > 2 * before, f"the rate limit did not slow the steps ({during:.2f}s vs {before:.2f}s for 10)"
    assert_nobody_taken_out(job)


@pytest.mark.timeout(300)
def test_a_replica_cut_from_the_coordinator_is_dropped_and_the_others_commit_on(job_in_lab):
    """r2's control link goes down, its data link stays up: the coordinator
    drops it for its heartbeat timeout, as always, and r0 and r1 commit on
    at once, not after a collective timeout. r2, which may be in the
    all-reduce with them when they are told, never commits a step they redo
    without it (fthsdp/agent/training/ftar/vote.py; it failed 1 run in 10 before). Healed,
    r2 comes back and catches up."""
    job = job_in_lab()
    lab = job.lab
    head = job.training(lab.names, contributors=3, steps=20, timeout=120)
    cut_at = time.monotonic()
    lab.cut_control("r2")
    job.log.wait_event("quorum_change", 30, members=lambda m: m is not None and "r2" not in m,
                       reason=has("members leaving: r2 (heartbeat timeout)"))
    after = job.training(["r0", "r1"], contributors=2, past=head, steps=10, timeout=60)
    stall = first_step_with(job, "r0", 2, head)["t"] - cut_at
    assert stall < 10, f"r0 and r1 committed {stall:.1f}s after the cut (the heartbeat timeout is 2s)"
    assert not job.log.taken_out("r0", "r1")
    lab.heal_control("r2")
    job.training(["r2"], contributors=3, past=after, steps=20, timeout=150)
    assert_one_state_per_step(job)
    assert_no_step_lost(job, ["r0", "r1"])
