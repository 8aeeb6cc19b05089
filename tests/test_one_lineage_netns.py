"""One job, one lineage (issue 48), with real processes in network namespaces.

A quorum whose members reach each other over their data links but not the
coordinator trains on: its collectives need nobody else. If the coordinator
meanwhile restores a checkpoint with other replicas, two lineages of the job
commit steps at once, and both write checkpoints into the same folder. A
member lease closes that: a member that has not heard from the coordinator
for ``--member-lease`` commits nothing more ("member lease lapsed" in its
log), and the coordinator forms no quorum without a previous member before
every lease it granted has run out (a ``lease_wait`` event while it waits).

1. r2's training process is SIGKILLed and, as soon as the coordinator drops
   it, r0 and r1 are cut from the coordinator (their data links stay up).
   The coordinator loses the state, restores the newest checkpoint and trains
   with r2 alone; healed, r0 and r1 come back into r2's lineage. Never two
   lineages committing at once, one state per step in each, every checkpoint
   folder of one lineage.
2. All three are cut from the coordinator for less than its heartbeat timeout
   plus its join timeout: they pause within the lease and, healed, go on
   with nothing lost.

They need root and iproute2 (CI has both); elsewhere they skip, saying why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from fthsdp.agent.training.checkpoint import layout
from tests.harness.netjob import Job, assert_no_step_lost, assert_one_state_per_step, jobs_in_lab
from tests.harness.waiting import wait_until

EVERY = 10
"""Steps between checkpoints."""
LAPSED = "member lease lapsed"
"""What a member logs (into its agent's log: the ranks share it) when its lease ran out."""
SLACK = 2.0
"""Seconds past the lease a member cut off may still be seen committing (its last commit began in
the lease; the line reaches its agent's stdout)."""
HEARTBEAT_TIMEOUT, JOIN_TIMEOUT = 2.0, 2.0
"""Case 1's coordinator's (the Job's own, tests/harness/netjob.py COORDINATOR_ARGS): it gives up on members
it does not hear from after both, the split-brain guard's wait included."""


@pytest.fixture
def job_in_lab(tmp_path, etcd_url, key_prefix):
    with jobs_in_lab(tmp_path, etcd_url, key_prefix) as make:
        yield make


def lapsed(job: Job, name: str) -> bool:
    return LAPSED in job.agents[name].log_path.read_text(errors="replace")


class Lineages:
    """Every step line the replicas printed, split into the lineage cut off
    from the coordinator and the one its restore started.

    How they are told apart: by quorum id. Each step line carries the id of
    the quorum that committed it, and the coordinator numbers quorums in one
    increasing sequence. Members cut off from the coordinator hear of no
    later quorum, so whatever they commit during the cut is in the quorum
    they were in when cut, formed before the restore. The restored lineage
    starts in the first quorum the coordinator forms after its ``restore``
    event (``first``), and every later quorum (the one r0 and r1 come back
    in too) has a higher id. So a line of a quorum below ``first`` is of
    the old lineage (before the cut too: r2's first incarnation's lines are
    in it), any other of the restored one. The lines' times (``t``,
    CLOCK_MONOTONIC of the rank: one clock for every process on this
    machine, this test's too) then say when each lineage committed."""

    def __init__(self, job: Job, first: int) -> None:
        self.job, self.first = job, first

    def of(self, quorum_id: int) -> str:
        return "restored" if quorum_id >= self.first else "cut"

    def old(self, *names: str) -> list[dict]:
        return [line for name in names or list(self.job.agents) for line in self.job.agents[name].step_lines
                if line["quorum"] < self.first]

    def new(self, *names: str) -> list[dict]:
        return [line for name in names or list(self.job.agents) for line in self.job.agents[name].step_lines
                if line["quorum"] >= self.first]


def assert_never_two_at_once(lines: Lineages) -> None:
    """(a) Every step r0 and r1 committed in the old lineage was committed
    before the restored lineage's first step."""
    first_new = min(line["t"] for line in lines.new())
    late = sorted((line["t"] - first_new, line["step"], line["quorum"]) for line in lines.old("r0", "r1")
                  if line["t"] >= first_new)
    assert not late, (f"the cut lineage committed {len(late)} steps after the restored one's first step: "
                      f"(seconds after it, step, quorum) {late[:3]} ... {late[-1]}")


def assert_paused_within_the_lease(lines: dict[str, list[dict]], cut_at: float, lease: float) -> None:
    """(c) Each replica's last step line (of ``lines``, by replica) came
    within its lease (plus ``SLACK``) of the cut."""
    for name, its in lines.items():
        last = max(its, key=lambda line: line["t"])
        assert last["t"] - cut_at <= lease + SLACK, (
            f"{name} committed step {last['step']} {last['t'] - cut_at:.1f}s after it was cut from the "
            f"coordinator (lease {lease:g}s)")


def checkpoint_shares(root: Path) -> dict[Path, list[dict]]:
    """Every share record under ``root`` (fthsdp/agent/training/checkpoint/share.py:
    ``share.json``, with the quorum that committed the step and the state's
    checksum), by checkpoint folder (the share folder's parent). A record
    being rewritten as it is read is left out; os.walk skips a folder removed meanwhile."""
    folders: dict[Path, list[dict]] = {}
    for where, _, files in os.walk(root):
        if layout.SHARE_RECORD in files:
            with contextlib.suppress(ValueError):
                folders.setdefault(Path(where).parent, []).append(
                    layout.read_record(Path(where) / layout.SHARE_RECORD))
    return folders


def assert_one_lineage_per_folder(folders: dict[Path, list[dict]], root: Path) -> None:
    """(d) The shares of each checkpoint folder were written by members of one quorum, of one state."""
    mixed = {str(folder.relative_to(root)): sorted({(r["quorum_id"], r["state_checksum"][:12]) for r in records})
             for folder, records in folders.items()
             if len({(r["quorum_id"], r["state_checksum"]) for r in records}) > 1}
    assert not mixed, f"checkpoint folders holding shares of different quorums or states: {sorted(mixed.items())[:3]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lease", [1.0, 6.0], ids=["lease-under-the-silence", "lease-past-the-silence"])
def test_a_quorum_cut_from_the_coordinator_stops_before_a_restored_one_trains_and_rejoins_it(
        job_in_lab, tmp_path, lease):
    """Issue 48's scenario. r0 and r1 commit nothing once their leases ran
    out, before the restored lineage's first step; the restored lineage
    redoes the steps after its checkpoint from the checkpoint, not from the
    cut lineage's states, and writes its checkpoints into folders of its own.

    With a lease of 1 s the members pause long before the coordinator could
    decide anything (it hears nothing from them for its heartbeat timeout,
    then waits its join timeout, the split-brain guard: 4 s); with 6 s it
    decides first and must wait for the leases to run out (one ``lease_wait``)."""
    root = tmp_path / "ckpt"
    job = job_in_lab(
        coordinator_args=("--min-replicas", "1", "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT:g}s",
                          "--join-timeout", f"{JOIN_TIMEOUT:g}s", "--auto-restore", "--member-lease", f"{lease:g}s"),
        # Every checkpoint kept (none deleted as a newer one is sealed), so that each folder either lineage
        # wrote is there to read at the end. r2's agent restarts its rank only once the coordinator no
        # longer counts r0 and r1 (heartbeat timeout, 2 s after the cut): a rank registered before might be
        # given one of them as its catch-up source, copy their state over the data path and hold it: no
        # restore, another scenario.
        agent_args=("--checkpoint-dir", str(root), "--checkpoint-every", str(EVERY), "--checkpoint-keep", "100000",
                    "--restart-backoff", "3s"))
    lab = job.lab
    job.training(lab.names, contributors=3, steps=4 * EVERY, timeout=120)
    wait_until(lambda: job.job_status().checkpoint.step >= 4 * EVERY, 60, interval=0.1,
               message=f"a checkpoint of step {4 * EVERY} or later recorded")

    killed = time.time()
    os.kill(job.rank_pid("r2"), signal.SIGKILL)  # r2's rank, not its agent: the agent restarts it, at step 0
    job.log.wait_event("quorum_change", 30, since=killed, members=lambda m: m is not None and "r2" not in m)
    cut_wall, cut_at = time.time(), time.monotonic()
    lab.cut_control("r0")
    lab.cut_control("r1")

    # No replica the coordinator hears from holds the state: it restores the newest checkpoint and
    # forms the restored lineage's first quorum with r2 (r0 and r1 are waited for, join_timeout, in vain).
    restore = job.log.wait_event("restore", 90, since=cut_wall)
    restored = restore["step"]
    first = job.log.wait_event("quorum_change", 90, since=restore["t"],
                               members=lambda m: m is not None and "r2" in m)["quorum_id"]
    lines = Lineages(job, first)
    job.training(["r2"], contributors=1, past=restored, steps=2 * EVERY, timeout=90, quorum=first)
    job.drain("r0", "r1")
    # While r0 and r1 are still cut off: (a) and (c) as far as their lines so far tell.
    assert_never_two_at_once(lines)
    assert_paused_within_the_lease({n: lines.old(n) for n in ("r0", "r1")}, cut_at, lease)
    wait_until(lambda: lapsed(job, "r0") and lapsed(job, "r1"), 10, interval=0.1,
               message=f"r0 and r1 logging {LAPSED!r} while cut from the coordinator")
    cut_folders = {folder: {r["quorum_id"] for r in records} for folder, records in checkpoint_shares(root).items()}

    lab.heal_control("r0")
    lab.heal_control("r1")
    job.training(["r0", "r1", "r2"], contributors=3, past=restored, steps=EVERY, timeout=150, quorum=first)
    waits = job.log.events_named("lease_wait", since=cut_wall)  # before the drain at the end has its own quorums
    job.stop()  # every line read, every share written: nothing changes the folders while they are read
    lines = Lineages(job, first)

    # (a) Never two quorums committing at once, the lines read since the heal included.
    assert_never_two_at_once(lines)
    # (b) One state per step within each lineage; the restored one redid the steps after its
    # checkpoint from it, so it shares no state with the cut one past that step.
    assert_one_state_per_step(job, lines.old(), "the cut lineage")
    assert_one_state_per_step(job, lines.new(), "the restored lineage")
    cut_states = {(line["step"], line["checksum"]) for line in lines.old() if line["step"] > restored}
    reused = sorted(line["step"] for line in lines.new() if (line["step"], line["checksum"]) in cut_states)
    assert not reused, f"the restored lineage has the cut lineage's states at steps {reused[:5]}"
    r2_steps = sorted({line["step"] for line in lines.new("r2")})
    # r0 and r1 came back into r2's lineage, not r2 into theirs: r2's steps go on from the restored one.
    assert r2_steps == list(range(restored + 1, r2_steps[-1] + 1)), (
        f"r2's steps since the restore of step {restored} jump: "
        f"{[(a, b) for a, b in zip(r2_steps, r2_steps[1:], strict=False) if b != a + 1][:3]}")
    # (c) r0 and r1 paused within their leases; the coordinator waited for them (once) only where
    # their leases outlasted its silence: heartbeat timeout, then the split-brain guard's join timeout.
    assert_paused_within_the_lease({n: lines.old(n) for n in ("r0", "r1")}, cut_at, lease)
    expected = 1 if lease > HEARTBEAT_TIMEOUT + JOIN_TIMEOUT else 0
    assert len(waits) == expected, (f"{len(waits)} lease_wait events, {expected} expected (lease {lease:g}s): "
                                    f"{[w['message'] for w in waits[:3]]}")
    # (d) Every checkpoint folder holds one lineage's shares: a folder the cut lineage wrote was not
    # taken over by the restored one (which writes its checkpoints under other paths), nor the reverse.
    folders = checkpoint_shares(root)
    assert folders, "no checkpoint written"
    assert_one_lineage_per_folder(folders, root)
    for folder, quorums in cut_folders.items():  # what each held during the cut, and holds now
        now = {r["quorum_id"] for r in folders.get(folder, [])}
        assert len({lines.of(q) for q in quorums | now}) == 1, (
            f"{folder.relative_to(root)} held shares of both lineages (quorums {sorted(quorums)} during the cut, "
            f"{sorted(now)} at the end)")
    last_old = max(line["t"] for line in lines.old("r0", "r1"))
    print(f"the cut lineage's last step {last_old - cut_at:.2f}s after the cut, "
          f"{min(line['t'] for line in lines.new()) - last_old:.2f}s before the restored lineage's first")


@pytest.mark.timeout(300)
def test_a_quorum_cut_from_the_coordinator_for_less_than_its_timeouts_pauses_and_goes_on_with_nothing_lost(
        job_in_lab):
    """All three members are cut from the coordinator at once. Each pauses
    once its lease (1 s) ran out, well before the coordinator gives up on
    them (heartbeat timeout 3 s, then the split-brain guard's join timeout
    6 s); healed, the same quorum goes on: no state lost, no step skipped."""
    lease = 1.0
    job = job_in_lab(coordinator_args=("--heartbeat-timeout", "3s", "--join-timeout", "6s",
                                       "--member-lease", f"{lease:g}s"))
    lab = job.lab
    job.training(lab.names, contributors=3, steps=20, timeout=120)
    cut_wall, cut_at = time.time(), time.monotonic()
    for name in lab.names:
        lab.cut_control(name)
    wait_until(lambda: all(lapsed(job, name) for name in lab.names), 30, interval=0.05,
               message=f"every member logging {LAPSED!r}")
    seen_at = time.monotonic()
    # Some time later (the coordinator's heartbeat timeout ran out for all three: its split-brain
    # guard's wait begins), nothing more was committed; the cut lasts until then.
    job.log.wait(r"split-brain guard: 3 of 3 members went silent at once", 30, since=cut_wall)
    job.drain()
    assert not job.log.events_named("state_lost"), job.coordinator.log_tail()
    paused = {name: max(line["step"] for line in job.agents[name].step_lines if line["t"] <= seen_at)
              for name in lab.names}
    late = {name: [line["step"] for line in job.agents[name].step_lines if line["t"] > seen_at]
            for name in lab.names}
    assert not any(late.values()), f"steps committed after every lease had lapsed, before the heal: {late}"
    assert_paused_within_the_lease({name: job.agents[name].step_lines for name in lab.names}, cut_at, lease)
    for name in lab.names:
        lab.heal_control(name)
    job.training(lab.names, contributors=3, past=max(paused.values()), steps=EVERY, timeout=90)
    assert not job.log.events_named("state_lost"), "the state was declared lost"
    assert not job.log.events_named("restore"), "a checkpoint was restored"
    assert_no_step_lost(job, lab.names)
    assert_one_state_per_step(job)
