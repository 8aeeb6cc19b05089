"""The accuracy benchmark (benchmarks/accuracy.py): its argument errors, how
it reads the ranks' lines, and (slow) a real job in which a killed replica
catches up and ends with the job's sample count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# benchmarks/ is not an installed package: import it from the checkout, as the script does.
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy import AccuracyConfig  # noqa: E402
from benchmarks.accuracy_job import JobFailed, JobSpec, Outage, _result, run_job  # noqa: E402


@pytest.mark.parametrize("args, says", [
    (["--samples", "100"], "--samples 100 is too few"),
    (["--spread-seed", "0"], "--spread-seed another seed"),
    (["--eval-every", "0"], "--eval-every must be at least 1"),
    (["--global-batch", "20"], "--global-batch must be 0 or a multiple of 6"),
    (["--samples", "many"], "invalid int value"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_bad_arguments_are_one_line(args, says):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy.py"), *args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and says in p.stderr and "Traceback" not in p.stderr


def test_schedules_follow_the_failure_free_steps():
    config = AccuracyConfig(samples=2400, spread_seed=-1)  # 100 steps of 3 x 8
    no_failure, kills, long_out = config.jobs()
    assert config.reference_steps == 100 and not no_failure.outages
    assert [(o.replica, o.step, o.out_steps) for o in kills.outages] == [(2, 25, 0), (1, 50, 0), (0, 75, 0)]
    assert [(o.replica, o.step, o.out_steps) for o in long_out.outages] == [(1, 25, 33)]
    assert len(AccuracyConfig(samples=2400, spread_seed=3).jobs()) == 4
    assert {j.global_batch for j in config.jobs()} == {24}
    per_replica = AccuracyConfig(samples=2400, spread_seed=-1, global_batch=0, two_replica_control=True)
    assert per_replica.reference_steps == 100 and per_replica.jobs()[-1].replicas == 2


def _step(step, loss, replicas, samples):
    return {"step": step, "loss": loss, "replicas": replicas, "samples": samples}


SPEC = JobSpec("t", 0, samples=64, replicas=2, batch_size=8)


def test_result_counts_samples_from_the_contributors():
    lines = {
        "r0": [_step(1, 3.0, 2, 16), _step(2, 2.0, 1, 24), {"step": 2, "samples": 24, "val_loss": 2.5},
               _step(3, 1.0, 2, 40), _step(4, 1.0, 2, 56), _step(5, 1.0, 2, 72), {"done": 5, "samples": 72}],
        "r1": [{"start_step": 0, "catch_up": None}, _step(1, 5.0, 2, 16), {"failing": "kill", "step": 1},
               {"start_step": 2, "catch_up": {"source": "r0"}}, _step(3, 3.0, 2, 40),  # stale: not in the mean
               {"step": 5, "samples": 72, "val_loss": 2.0}, {"done": 5, "samples": 72}],
    }
    r = _result(SPEC, lines, ["r0", "r1"], 1.0)
    assert (r.steps, r.samples, r.samples_from_steps, r.failures, r.replica_steps_out) == (5, 72, 72, 1, 1)
    assert r.contributors == [2, 1, 2, 2, 2]
    assert r.train[:4] == [(16, 4.0), (24, 2.0), (40, 1.0), (56, 1.0)]
    assert r.val == [(24, 2.5), (72, 2.0)] and r.final_val == 2.0 and r.val_disagreements == 0


@pytest.mark.parametrize("lines, says", [
    ({"r0": [_step(1, 1.0, 2, 16), _step(3, 1.0, 2, 48), {"done": 3, "samples": 48}],
      "r1": [{"done": 3, "samples": 48}]}, "committed steps [2]"),
    ({"r0": [_step(1, 1.0, 2, 16), {"done": 1, "samples": 16}], "r1": [{"done": 1, "samples": 8}]},
     "different sample counts"),
    ({"r0": [_step(1, 1.0, 2, 16), {"done": 1, "samples": 16}],
      "r1": [_step(1, 1.0, 1, 16), {"done": 1, "samples": 16}]}, "disagree on step 1"),
])
def test_result_refuses_inconsistent_lines(lines, says):
    with pytest.raises(JobFailed, match=says.replace("[", r"\[").replace("]", r"\]")):
        _result(SPEC, lines, ["r0", "r1"], 1.0)


@pytest.mark.slow
def test_a_killed_replica_ends_with_the_jobs_sample_count(tmp_path):
    """train.py --samples: the count reaches a replica that catches up (in the
    snapshot, then with the replayed steps), so every replica stops at the
    same step; the count equals the committed steps' contributors x batch."""
    spec = JobSpec("kill", 0, samples=2 * 8 * 40, replicas=2, eval_every=20, outages=(Outage(1, 6),))
    r = run_job(spec, tmp_path, timeout=300)
    assert r.failures == 1 and r.replica_steps_out > 0
    assert r.samples == r.samples_from_steps >= spec.samples
    assert r.steps > 40  # the steps with one replica took fewer samples
    assert r.val_disagreements == 0 and r.val[-1][0] == r.samples


def _fake_job(spec: JobSpec, logs, timeout):
    """A job's lines as the ranks write them, without the job: every replica
    commits every step of its share; each outage costs its replica one step."""
    share = spec.global_batch // spec.replicas if spec.global_batch else spec.batch_size
    ids = [f"r{i}" for i in range(spec.replicas)]
    lines: dict[str, list[dict]] = {r: [] for r in ids}
    out = {(o.replica, o.step) for o in spec.outages}
    samples, step = 0, 0
    while samples < spec.samples:
        step += 1
        members = [i for i in range(spec.replicas) if (i, step) not in out]
        batch = spec.global_batch // len(members) if spec.global_batch else share
        samples += batch * len(members)
        for i in members:
            o = {**_step(step, 2.0 + 1 / step + spec.seed / 100, len(members), samples), "batch": batch}
            lines[ids[i]].append(o)
        for i in range(spec.replicas):
            if (i, step) in out:
                lines[ids[i]].append({"failing": "kill", "step": step})
        if step % spec.eval_every == 0:
            for r in ids:
                lines[r].append({"step": step, "samples": samples, "val_loss": 2.0 + 1 / step})
    for r in ids:
        lines[r] += [{"step": step, "samples": samples, "val_loss": 2.0 + 1 / step}, {"done": step, "samples": samples}]
    return _result(spec, lines, ids, 1.0)


def test_the_script_prints_its_table_verdicts_and_checks(monkeypatch, capsys, tmp_path):
    """accuracy.py's main end to end with each job's lines made here: the
    table, one verdict per run against the failure-free one, no check failed.
    (A real job runs in the slow test above; the full runs make the README's table.)"""
    import benchmarks.accuracy as accuracy

    specs: list[JobSpec] = []
    monkeypatch.setattr(accuracy, "run_job", lambda spec, logs, timeout: specs.append(spec) or
                        _fake_job(spec, logs, timeout))
    code = accuracy.main(["--samples", "1920", "--eval-every", "40", "--png", "", "--logs", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert [s.name for s in specs] == [s.name for s in AccuracyConfig(samples=1920, eval_every=40).jobs()]
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [int(row.split("|")[4]) for row in rows] == [len(s.outages) for s in specs]  # the failures column
    verdicts = [line for line in out.splitlines() if "against the failure-free run" in line]
    assert len(verdicts) == len(specs) - 1 and any("met; target within 1%" in v for v in verdicts)
