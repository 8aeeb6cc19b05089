"""`fthsdp demo`: real runs of the demo (coordinator, agents, the example model),
its clean-up on Ctrl-C, its settings, and the summary's arithmetic."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from fthsdp.cli.main import main
from fthsdp.demo.children import child_environment, marked_pids
from fthsdp.demo.record import Failure, RankStart, Recorder, StatusSample, StepLine
from fthsdp.demo.summary import summarize, summary_text
from tests.harness.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
TEST_MARK = "DEMO_TEST_MARK"
"""Set for the demo by the test and inherited by everything it starts, so the
test can find every one of its processes, whoever their parent is now."""


def _demo(tmp_path: Path, mark: str, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")}
    env[TEST_MARK] = mark
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "fthsdp", "demo", "--no-live", "--out", str(tmp_path / "out"), *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data[-8:-4] == b"IEND", "PNG truncated"
    return width, height


def _logs(folder: Path, lines: int = 25) -> str:
    """The end of every log the demo wrote (the agents' stdout holds the ranks'
    JSON lines), so that a failure in CI can be read without the machine."""
    tails = []
    for path in sorted(folder.glob("*")):
        text = path.read_text(errors="replace").splitlines()
        if path.suffix == ".out":  # the ranks' lines but their step lines
            text = [line for line in text if '"loss"' not in line]
        tails.append(f"\n----- {path.name} (last {min(lines, len(text))} lines) -----\n" + "\n".join(text[-lines:]))
    return "".join(tails)


def _run_to_end(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[dict, str]:
    mark = uuid.uuid4().hex
    proc = _demo(tmp_path, mark, *args)
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output + _logs(tmp_path / "out" / "logs")
    wait_until(lambda: not marked_pids(mark, TEST_MARK), 10, message="processes of the demo still running")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    width, height = _png_size(tmp_path / "out" / "demo.png")
    assert width >= 800 and height >= 600
    assert (tmp_path / "out" / "demo.png").stat().st_size > 30_000  # two plots, not an empty canvas
    return summary, output


@pytest.mark.timeout(300)
def test_demo_kill_restart_catch_up(tmp_path):
    summary, output = _run_to_end(tmp_path, "--replicas", "3", "--steps", "40", "--fail-step", "10")
    assert summary["ok"] and summary["error"] is None
    assert summary["all_reached_final_step"] and summary["final_steps"] == {"r0": 40, "r1": 40, "r2": 40}
    f = summary["failure"]
    assert f["replica"] == "r2" and f["mode"] == "kill" and f["step"] >= 10
    # A SIGKILLed process's Watch stream closes: detected well before the 2 s heartbeat timeout.
    assert f["detected"] and 0 <= f["time_to_detect_s"] < 1.5, f
    assert "stream closed" in f["detect_reason"] or "failed" in f["detect_reason"], f["detect_reason"]
    assert f["restarted"] and f["restart_count"] >= 1
    assert f["caught_up"] and f["catch_up_source"] in ("r0", "r1")
    assert f["catch_up_bytes"] > 1_000_000  # the 3.2M-parameter model and its optimizer state
    assert f["time_to_detect_s"] < f["time_to_rejoin_quorum_s"] <= f["time_to_recover_s"]
    assert f["survivor_steps_skipped"] == 0
    assert 0 < summary["steps_lost"] < 3 * 40 and summary["replica_steps_trained"] == 120 - summary["steps_lost"]
    assert 0.3 < summary["effective_training_time"] < 1.0
    assert [q["members"] for q in summary["quorum_history"]].count(["r0", "r1"]) >= 1
    for key in ("time_to_detect_s", "time_to_recover_s", "catch_up_bytes", "steps_lost", "effective_training_time"):
        assert key in summary["definitions"] or key in f
    assert "time to recover" in output and "effective training time" in output
    assert "Traceback" not in output


@pytest.mark.timeout(300)
def test_demo_kill_all_restores_the_newest_checkpoint(tmp_path):
    """Every replica SIGKILLed at once after step 15: the coordinator restores the
    checkpoint of step 10, the restarted replicas load it and train on to the end."""
    summary, output = _run_to_end(tmp_path, "--fail-mode", "kill-all", "--steps", "40", "--fail-step", "15")
    assert summary["ok"] and summary["error"] is None
    assert summary["all_reached_final_step"] and summary["final_steps"] == {"r0": 40, "r1": 40, "r2": 40}
    f = summary["failure"]
    assert f["mode"] == "kill-all" and f["replica"] == "all" and f["step"] >= 15
    assert sorted(f["pids"]) == ["r0", "r1", "r2"] and len(set(f["pids"].values())) == 3
    assert f["restored"] and f["restored_step"] == 10 and f["requested_by"] == "automatic"
    assert f["checkpoint_path"].startswith(str(tmp_path / "out" / "checkpoints"))
    # The coordinator's lost step is the newest it heard of; the replicas' lines may be a step ahead.
    assert 10 < f["lost_step"] <= f["last_step_committed"] and f["last_step_committed"] >= 15
    assert f["committed_steps_lost"] == f["last_step_committed"] - 10
    assert f["restarted"] and f["restart_count"] >= 1
    # The first to load it train on at once; one that loads it after they trained on catches up from them.
    assert sorted([*f["loaded_checkpoint"], *f["caught_up_from"]]) == ["r0", "r1", "r2"]
    assert f["loaded_checkpoint"], "no replica loaded the checkpoint"
    assert 0 <= f["time_to_restore_s"] < f["time_to_rejoin_quorum_s"] <= f["time_to_recover_s"] < 60, f
    assert f["first_step_trained_again"] >= 11
    # The steps after the checkpoint were committed by three replicas, lost with the state and trained again.
    assert summary["replica_steps_redone"] >= 3 * 5
    assert summary["replica_steps_trained"] == 120 - summary["steps_lost"] and summary["steps_lost"] < 20
    assert 0.3 < summary["effective_training_time"] < 1.0
    assert "SIGKILL every replica's training process" in output
    assert "the coordinator restored the checkpoint of step 10 automatically" in output
    assert "never dropped" not in output and "Traceback" not in output


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_demo_hang_on_etcd_is_found_by_the_heartbeat_timeout(tmp_path):
    summary, output = _run_to_end(tmp_path, "--store", "etcd", "--fail-mode", "hang", "--fail-replica", "0",
                                  "--steps", "50", "--fail-step", "10")
    assert "started a private etcd" in output
    f = summary["failure"]
    assert f["replica"] == "r0" and f["mode"] == "hang"
    assert "heartbeat timeout" in f["detect_reason"], f["detect_reason"]
    assert 0.5 < f["time_to_detect_s"] < 4.0  # the demo's --heartbeat-timeout is 2 s
    assert f["restarted"] and f["caught_up"] and f["catch_up_bytes"] > 0
    assert summary["all_reached_final_step"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_demo_deadlock_is_taken_out_as_hung_restarted_and_caught_up(tmp_path):
    """The victim's loop blocks after its backward pass, its heartbeats go on:
    only the others' wait in the all-reduce tells (the demo's limit: 3 x the
    median step, at least 2 s)."""
    summary, output = _run_to_end(tmp_path, "--fail-mode", "deadlock", "--steps", "40", "--fail-step", "10")
    f = summary["failure"]
    assert f["replica"] == "r2" and f["mode"] == "deadlock" and f["step"] == 10
    assert "r2 (hung: no progress at step 10" in f["detect_reason"], f["detect_reason"]
    assert 1.5 < f["time_to_detect_s"] < 15, f
    # Its agent ended it after the stack dump (the training thread blocked in train.py), restarted it; it caught up.
    assert f["stacks_in"] == "logs/r2.log"
    log = (tmp_path / "out" / "logs" / "r2.log").read_text()
    # The dump's heading, then the stacks. The agent's own line may come before or after it: the rank
    # and the agent are told of the verdict on separate streams (through the agent's relay).
    heading = "fthsdp: replica r2 rank 0 taken out by the coordinator: hung: no progress at step 10"
    assert heading in log and "train.py" in log.split(heading)[1].split("fthsdp.agent:")[0], log
    assert f["restarted"] and f["restart_count"] >= 1
    assert f["caught_up"] and f["catch_up_source"] in ("r0", "r1") and f["catch_up_bytes"] > 1_000_000
    assert f["time_to_detect_s"] < f["time_to_rejoin_quorum_s"] <= f["time_to_recover_s"]
    # The survivors kept committing: every step once, the stalled one among the two of them.
    assert f["survivor_steps_skipped"] == 0
    assert summary["all_reached_final_step"] and summary["final_steps"] == {"r0": 40, "r1": 40, "r2": 40}
    assert [q["members"] for q in summary["quorum_history"]].count(["r0", "r1"]) >= 1
    assert "r2 was deadlocked (its training loop blocked after the backward pass" in output
    assert "the coordinator took it out as hung" in output
    assert "its agent ended the hung process (stacks dumped in logs/r2.log) and restarted it" in output
    assert "the survivors went on: 0 steps skipped" in output and "Traceback" not in output


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["ctrl-c", "sigterm"])
def test_an_interrupt_leaves_no_process_behind(tmp_path, sig):
    mark = uuid.uuid4().hex
    proc = _demo(tmp_path, mark, "--steps", "400", "--fail-step", "300")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        # Training: every replica admitted and stepping, so agents, ranks and standbys are all up.
        wait_until(lambda: any(" step   10 " in line for line in lines), 150, message="the demo training")
        running = marked_pids(mark, TEST_MARK)
        assert len(running) >= 1 + 1 + 3 + 3, running  # the demo, coordinator, 3 agents, 3 ranks
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 130
        reader.join(timeout=10)
        wait_until(lambda: not marked_pids(mark, TEST_MARK), 10,
                   message=f"processes left after {sig.name}: {marked_pids(mark, TEST_MARK)}")
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in marked_pids(mark, TEST_MARK):
            os.kill(pid, signal.SIGKILL)
    text = "".join(lines)
    assert f"interrupted ({sig.name})" in text and "Traceback" not in text
    assert "had to SIGKILL" not in text  # the agents drained their ranks; nothing needed the sweep


def test_an_unreachable_store_is_one_error_and_nothing_left(tmp_path):
    mark = uuid.uuid4().hex
    proc = _demo(tmp_path, mark, "--store", "etcd://127.0.0.1:1")
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, output
    assert "fthsdp demo: error: the coordinator exited" in output and "unreachable" in output
    assert "Traceback" not in output
    assert not marked_pids(mark, TEST_MARK)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["ok"] is False


@pytest.mark.parametrize("args, message", [
    (["--steps", "30"], "--steps 30 leaves too little after --fail-step 30"),
    (["--replicas", "1"], "at least 2 replicas"),
    (["--fail-replica", "3"], "--fail-replica must be in [0, 3)"),
    (["--fail-step", "0"], "--fail-step must be at least 1"),
    (["--store", "zookeeper"], "--store: expected memory, etcd or etcd://HOST:PORT"),
    (["--fail-mode", "kill-all", "--fail-step", "5"], "--fail-step 5 comes before the first checkpoint "
                                                      "(--checkpoint-every 10)"),
    (["--fail-mode", "kill-all", "--fail-step", "12", "--checkpoint-every", "15"],
     "--fail-step 12 comes before the first checkpoint (--checkpoint-every 15)"),
    (["--fail-mode", "kill-all", "--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
    (["--fail-mode", "kill-all", "--fail-replica", "1"], "--fail-mode kill-all kills every replica"),
    (["--checkpoint-every", "5"], "--checkpoint-every is for --fail-mode kill-all"),
])
def test_bad_settings_are_one_line(args, message, capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path / "x"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()  # nothing started, nothing written


def test_children_from_a_checkout_import_its_code_first():
    """Run from the repository (this suite), the demo's children get it ahead
    of the user's PYTHONPATH; the user's FTHSDP_* settings are left out."""
    env = child_environment({"PYTHONPATH": "/elsewhere", "FTHSDP_JOB": "x", "HOME": "/h"}, "mark")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert "FTHSDP_JOB" not in env and env["HOME"] == "/h" and env["FTHSDP_DEMO_RUN"] == "mark"


def _recorder_with(lines: dict[str, list[tuple[int, float, int]]],
                   starts: dict[str, list[tuple[float, int]]]) -> Recorder:
    rec = Recorder(sorted(lines))
    for replica, entries in starts.items():
        for t, step in entries:
            rec.starts[replica].append(RankStart(replica, 1, step, 1, t, None))
    for replica, entries in lines.items():
        for step, t, contributors in entries:
            rec.steps[replica].append(StepLine(replica, step, 1.0, 1, contributors, t))
        rec.done[replica] = entries[-1][0]
    return rec


def test_summary_counts_lost_steps_and_effective_time():
    """Two replicas, 6 steps of 1 s; b is out for steps 3-4 and comes back for step 5
    (caught up at t=4.5): 2 replica-steps lost; b trained 3.5 of the 6 seconds."""
    a = [(s, float(s), 2 if s not in (3, 4) else 1) for s in range(1, 7)]
    b = [(1, 1.0, 2), (2, 2.0, 2), (5, 5.0, 2), (6, 6.0, 2)]
    rec = _recorder_with({"a": a, "b": b}, {"a": [(0.0, 0)], "b": [(0.0, 0), (4.5, 4)]})
    failure = Failure("b", "kill", pid=1, step=2, t=2.1, wall=0.0, quorum_before=1)
    s = summarize(rec, failure, replicas=2, steps=6)
    assert s["steps_lost"] == 2 and s["replica_steps_trained"] == 10
    # a: 6 s of training; b: steps 1, 2 (2 s) and step 5 from its start at 4.5 (0.5 s) and 6 (1 s).
    assert s["effective_training_time"] == pytest.approx((6 + 3.5) / (2 * 6), abs=1e-3)
    assert s["all_reached_final_step"]
    assert s["failure"]["restarted"] and s["failure"]["survivor_steps_skipped"] == 0
    assert s["failure"]["detected"] is False  # no status was recorded: nothing is claimed
    assert s["failure"]["time_to_recover_s"] is None and not s["failure"]["caught_up"]


def test_summary_of_kill_all_counts_the_redone_steps_once():
    """Two replicas, 1 s steps; a checkpoint of step 2; both killed at t=4.1 after
    step 4; the coordinator restores step 2 at 4.4; both restart (load it) at
    t=5, are one quorum again at 5.2 and commit steps 3-6 at t=6-9. Steps 3 and
    4 were committed twice: their first training is lost, not trained."""
    before = [(s, float(s), 2) for s in range(1, 5)]
    after = [(s, float(s + 3), 2) for s in range(3, 7)]
    rec = _recorder_with({"a": before + after, "b": before + after}, {"a": [(0.0, 0), (5.0, 2)],
                                                                      "b": [(0.0, 0), (5.0, 2)]})
    wall = rec.wall_offset
    failure = Failure("all", "kill-all", pid=2, step=4, t=4.1, wall=wall + 4.1, quorum_before=1,
                      killed_t=4.1, pids={"a": 1, "b": 2})
    restore = {"restored_step": 2, "restored_path": "/c/step-2", "lost_step": 4,
               "restore_unix_ms": int((wall + 4.4) * 1000), "restore_requested_by": "automatic"}
    rec.samples += [
        StatusSample(1.0, 1, ("a", "b"), int(wall * 1000), "admitting a, b", {}, checkpoint_step=2),
        StatusSample(4.6, 1, ("a", "b"), int(wall * 1000), "admitting a, b", {}, checkpoint_step=2, **restore),
        StatusSample(5.5, 3, ("a", "b"), int((wall + 5.2) * 1000), "admitting a, b", {}, quorum_step=2,
                     checkpoint_step=2, **restore),
    ]
    s = summarize(rec, failure, replicas=2, steps=6)
    assert s["steps_lost"] == 0 and s["replica_steps_trained"] == 12 and s["replica_steps_redone"] == 4
    # Each replica: steps 1-2 (2 s) and 3-6 after its restart at 5.0 (4 s); 9 s from the first start to the end.
    assert s["effective_training_time"] == pytest.approx(12 / 18, abs=1e-3)
    f = s["failure"]
    assert f["restored"] and f["restored_step"] == 2 and f["committed_steps_lost"] == 2
    assert f["time_to_restore_s"] == pytest.approx(0.3, abs=0.01)
    assert f["quorum_rejoined"] == 3 and f["time_to_rejoin_quorum_s"] == pytest.approx(1.1, abs=0.01)
    assert f["first_step_trained_again"] == 3 and f["time_to_recover_s"] == pytest.approx(1.9, abs=1e-3)
    assert f["loaded_checkpoint"] == ["a", "b"] and f["caught_up_from"] == {}
    text = summary_text(s, "/out")
    assert "every replica's training process was SIGKILLed at once after step 4" in text
    assert "the coordinator restored the checkpoint of step 2 automatically, 0.3 s after the kill: " \
           "2 committed steps lost: 3-4" in text
    assert "a, b loaded the checkpoint" in text
    assert "every replica in one quorum again 1.1 s after the kill (quorum 3, at step 2)" in text
    assert "training again from step 3: time to recover 1.9 s" in text
    assert "4 replica-steps redone" in text and "never dropped" not in text and "caught up" not in text


def test_a_line_cut_by_a_kill_loses_neither_object():
    """Unbuffered, a rank writes a line and its newline in two writes: one
    SIGKILLed between them leaves its step line open, and its restart's first
    line lands on the same line (how a restart once went unseen in CI)."""
    rec = Recorder(["r1"])
    step = json.dumps({"step": 15, "loss": 1.5, "quorum": 1, "replicas": 3, "t": 1.0})
    start = json.dumps({"replica": "r1", "start_step": 10, "pid": 42, "quorum": 3, "t": 2.0,
                        "catch_up": {"source": "r0", "snapshot_step": 10}})
    rec.rank_line("r1", step + start, 2.0)
    rec.rank_line("r1", "not JSON {at all", 3.0)
    assert [line.step for line in rec.steps["r1"]] == [15]
    assert [(s.pid, s.start_step, s.catch_up) for s in rec.starts["r1"]] == [(42, 10, {"source": "r0",
                                                                                     "snapshot_step": 10})]
