"""The goodput simulator's correlated failures and checkpoints
(benchmarks/goodput/correlated.py): the table's accounting, and the engine
charging what the table does."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from itertools import pairwise
from pathlib import Path

import pytest

# benchmarks/ is not an installed package: import it from the checkout, as
# `python benchmarks/goodput_sim.py` does, whichever way pytest was started.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import goodput_sim  # noqa: E402
from benchmarks.goodput import calibration as cal  # noqa: E402
from benchmarks.goodput import correlated as corr  # noqa: E402
from benchmarks.goodput import engine, inputs  # noqa: E402
from benchmarks.goodput.modes import run_cell  # noqa: E402

K = cal.KOKOLIS

HOUR = 3600.0
CKPT = corr.Checkpoints(interval_s=1800, restore_s=300, save_cost=0.5, operator_s=HOUR)
NO_CKPT = corr.Checkpoints(operator_s=HOUR)
NO_EVENTS = corr.Correlated(domain_share=0.0, whole_job_every_days=0.0)


@pytest.mark.parametrize(
    "rate, run, outage, expected",
    [
        (0.0, 30 * 86400, 3600, 1.0),  # no event: the whole run is kept
        (1 / 100, 100, 0, 1 - math.exp(-1)),  # one event expected, no outage: e^-1 + (1 - 2e^-1)
        (1 / 100, 100, 100, math.exp(-1)),  # the outage outlasts the run: kept only if no event
        (1 / 100, 100, 500, math.exp(-1)),
        (1 / (30 * 86400), 30 * 86400, 3600, 0.6313),  # the table's fthsdp without checkpoints
        (1e-7, 86400, 3600, 1 - 1e-7 * (86400 / 2 + 3600)),  # rare events: half the run and the outage each
    ],
)
def test_kept_share_without_checkpoints(rate, run, outage, expected):
    assert corr.kept_share(rate, run, outage) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    "effective, rate, cost, expected",
    [
        (0.99, 0.0, 5000, 0.99),
        (0.99, 1 / (30 * 86400), 88 * 60, 0.99 * (1 - 88 / (30 * 1440))),
        (0.5, 1.0, 2.0, 0.0),  # floored: the events outrun the job
    ],
)
def test_whole_job_events_with_checkpoints(effective, rate, cost, expected):
    assert corr.with_whole_job_events(effective, rate, cost) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "got, expected",
    [
        (corr.restore_estimate_s(405e9 * 12, 781, 1000), 405e9 * 12 * 781 / 1e12),  # 3,796 s: 63 min at 100,000
        (corr.restore_estimate_s(1e12, 1, 1), 1000.0),
        (CKPT.steady_factor(6.0), 1 + 0.5 * 6 / 1800),  # half a step every 300 steps
        (NO_CKPT.steady_factor(6.0), 1.0),
        (CKPT.outage_s(600), 900.0),  # replacement, then the restore
        (NO_CKPT.outage_s(600), HOUR),  # the operator's give-up
        (dataclasses.replace(NO_CKPT, operator_s=60).outage_s(600), 600.0),  # never before the replicas are back
        (corr.checkpoint_event_cost_s(CKPT, 600), 900 + 900),  # the outage and half an interval
        (corr.Correlated().domain_replicas(781, 128), 8),  # 1,024 GPUs of 128-GPU replicas
        (corr.Correlated(domain_gpus=32).domain_replicas(781, 128), 1),  # a rack inside one replica
        (corr.Correlated().domain_replicas(8, 128), 8),  # a domain is the whole 1,024-GPU job
        (corr.Correlated(domain_gpus=4096).domain_replicas(8, 128), 8),
        (corr.Correlated(domain_fraction=0.1).domain_replicas(781, 128), 79),
        (corr.Correlated(whole_job_every_days=30).whole_job_rate_per_s, 1 / (30 * 86400)),
        (NO_EVENTS.whole_job_rate_per_s, 0.0),
    ],
)
def test_correlated_costs(got, expected):
    assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "checkpoints, expected",
    [
        (CKPT, corr.Rollback(progress_s=900.0, trained_s=950.0, lost_s=100.0)),  # back to the checkpoint's step
        (NO_CKPT, corr.Rollback(progress_s=0.0, trained_s=0.0, lost_s=1000.0)),  # back to step 0: all of it
    ],
)
def test_a_state_loss_rolls_back(checkpoints, expected):
    assert corr.roll_back(1000.0, 1100.0, 900.0, 950.0, checkpoints) == expected


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: corr.Correlated(domain_share=1.5), "domain_share"),
        (lambda: corr.Correlated(domain_gpus=0), "domain_gpus"),
        (lambda: corr.Correlated(whole_job_every_days=-1), "whole_job_every_days"),
        (lambda: corr.Checkpoints(restore_s=-1), "restore_s"),
        (lambda: corr.checkpoint_event_cost_s(NO_CKPT, 600), "kept_share"),
        (lambda: corr.kept_share(1.0, 0.0, 0.0), "positive run"),
    ],
)
def test_correlated_inputs_reject_nonsense(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _scripted(events, checkpoints=None, replicas=8, horizon=20_000.0, correlated=None):
    """A job without random failures, with events at set times."""
    costs = inputs.fthsdp_costs(replicas)
    sim = engine.ReplicatedSim(replicas, 128, 0.0, costs, random.Random(1), correlated=correlated,
                               checkpoints=checkpoints, scripted=events)
    return sim.run(horizon)


# The first quorum forms after the coordinator's 0.2 s join_settle, and so does the restored one.
SETTLE = 0.2


@pytest.mark.parametrize(
    "checkpoints, kept, lost, outage",
    [
        # A checkpoint every 30 min of training: at 11,400 s the newest is at 10,800 s; 600 s are
        # lost; the replicas are replaced (600 s) and load it (300 s), and train from 12,300 s.
        (CKPT, 10_800 + (20_000 - 12_300), 11_400 - 10_800, 900.0),
        # None: everything is lost; the replicas wait an hour for the operator and start over.
        (NO_CKPT, 20_000 - (11_400 + HOUR), 11_400, HOUR),
        (None, 20_000 - (11_400 + HOUR), 11_400, HOUR),
    ],
)
def test_a_whole_job_event_loses_the_training_since_the_checkpoint(checkpoints, kept, lost, outage):
    r = _scripted([(11_400.0, "whole-job")], checkpoints)
    assert r.whole_job_events == r.state_losses == 1
    assert r.failures == 0  # not one of the calibrated failures
    assert r.lost_progress_s == pytest.approx(lost - SETTLE, abs=1e-3)
    assert r.outage_s == pytest.approx(outage)
    assert r.effective * 20_000 == pytest.approx(kept - SETTLE, abs=1e-3)  # the restored quorum's settle
    first, restored = r.quorum_changes
    assert first.members == restored.members == 8
    assert restored.time_s == pytest.approx(11_400 + outage + SETTLE, abs=1e-3)


def test_a_domain_event_that_takes_every_replica_loses_the_state():
    # 1,024 GPUs in 8 replicas of 128: the job is one domain.
    domain = dataclasses.replace(NO_EVENTS, domain_gpus=1024)
    r = _scripted([(11_400.0, "domain:0")], CKPT, correlated=domain)
    whole = _scripted([(11_400.0, "whole-job")], CKPT)
    assert r.domain_events == r.failures == r.state_losses == 1
    assert r.effective == pytest.approx(whole.effective)
    assert r.lost_progress_s == pytest.approx(whole.lost_progress_s)


def test_a_domain_event_takes_its_replicas_out_together():
    domain = dataclasses.replace(NO_EVENTS, domain_gpus=256)  # 2 replicas of 128
    r = _scripted([(1000.0, "domain:1")], correlated=domain, replicas=16)
    assert r.state_losses == 0 and r.domain_events == 1
    _, shrink, grow = r.quorum_changes
    assert shrink.members == 14 and shrink.reason.startswith("members leaving: r02 (heartbeat timeout), r03")
    assert shrink.time_s == pytest.approx(1000 + inputs.Workload().heartbeat_timeout_s)
    assert grow.members == 16 and grow.time_s > 1000 + inputs.Workload().replacement_s


def test_most_members_silent_at_once_wait_for_the_split_brain_guard():
    domain = dataclasses.replace(NO_EVENTS, domain_fraction=0.75)  # 12 of 16 replicas
    r = _scripted([(1000.0, "domain:0")], correlated=domain, replicas=16)
    _, shrink, grow = r.quorum_changes
    join_timeout = 10.0  # the default coordinator's
    assert shrink.members == 4
    assert shrink.time_s == pytest.approx(1000 + inputs.Workload().heartbeat_timeout_s + join_timeout, abs=1e-3)
    assert grow.members == 16
    # The survivors waited through the guard too: the heartbeat timeout's stall and join_timeout.
    assert r.stall_per_failure_s > join_timeout + inputs.fthsdp_costs(16).hang_stall_s


@pytest.mark.parametrize(
    "when, first_quorum",
    [
        (1_100.0, 16),  # replaced before the restore ends (1,000 + 900 s): it loads the checkpoint too
        (1_500.0, 14),  # back after it: it catches up from the members, then joins
    ],
)
def test_a_replica_lost_during_the_restore(when, first_quorum):
    domain = dataclasses.replace(NO_EVENTS, domain_gpus=256)
    r = _scripted([(1000.0, "whole-job"), (when, "domain:0")], CKPT, correlated=domain, replicas=16)
    assert r.state_losses == 1  # the second event found no state to lose
    restored = r.quorum_changes[1]
    assert restored.members == first_quorum
    assert restored.time_s == pytest.approx(1000 + 900 + SETTLE, abs=1e-3)
    assert r.quorum_changes[-1].members == 16


def test_the_engine_charges_whole_job_events_as_the_table_does():
    # One event every 10 hours (the table's rate is once a month), checkpoints every 30 min.
    every = corr.Correlated(domain_share=0.0, whole_job_every_days=10 / 24)
    costs = inputs.fthsdp_costs(16)
    sim = engine.ReplicatedSim(16, 128, 0.0, costs, random.Random(1), correlated=every, checkpoints=CKPT,
                               correlated_rng=random.Random(7))
    r = sim.run(3000 * HOUR)
    assert r.whole_job_events > 250
    cost = corr.checkpoint_event_cost_s(CKPT, costs.restart_s)
    assert r.effective == pytest.approx(corr.with_whole_job_events(1.0, every.whole_job_rate_per_s, cost), abs=0.01)


def test_without_checkpoints_the_engine_keeps_what_kept_share_expects():
    every = corr.Correlated(domain_share=0.0, whole_job_every_days=10 / 24)  # one per run of 10 hours
    costs = inputs.fthsdp_costs(4)
    kept = [engine.ReplicatedSim(4, 128, 0.0, costs, random.Random(1), correlated=every, checkpoints=NO_CKPT,
                                 correlated_rng=random.Random(seed)).run(10 * HOUR).effective
            for seed in range(300)]
    expected = corr.kept_share(every.whole_job_rate_per_s, 10 * HOUR, HOUR)
    assert 0.3 < expected < 0.7
    assert sum(kept) / len(kept) == pytest.approx(expected, abs=0.05)


def test_zero_rates_reproduce_the_old_runs_exactly():
    for mode, gpus in (("fthsdp", 16_384), ("fthsdp-pessimistic", 2048), ("ft-hsdp", 16_384),
                       ("synchronous", 16_384)):
        old = run_cell(mode, gpus, K, 3, 10)
        new = run_cell(mode, gpus, K, 3, 10, correlated=NO_EVENTS)
        assert new == old, mode


def test_checkpoints_without_correlated_failures_cost_only_the_saves():
    old = run_cell("fthsdp", 16_384, K, 3, 10)
    saving = run_cell("fthsdp", 16_384, K, 3, 10, correlated=NO_EVENTS, checkpoints=CKPT)
    assert saving.result == old.result
    assert saving.steady_factor == pytest.approx(old.steady_factor * CKPT.steady_factor(6.0))


def test_domain_events_are_a_share_of_the_calibrated_failures():
    model = corr.Correlated(domain_share=0.5, domain_gpus=512, whole_job_every_days=0)
    cell = run_cell("fthsdp", 16_384, K, 4, 40, correlated=model, checkpoints=CKPT)
    r = cell.result
    assert 0.3 * r.failures < r.domain_events < 0.7 * r.failures
    assert r.state_losses == 0  # 4 replicas of 128 at a time, in 128
    drops = [b.members - q.members for b, q in pairwise(r.quorum_changes) if q.members < b.members]
    assert max(drops) >= 4  # a domain's replicas leave together


def test_checkpoint_variants_see_the_same_correlated_events():
    model = corr.Correlated(domain_share=0.5, domain_gpus=1024, whole_job_every_days=0)  # a domain is the job
    a = run_cell("fthsdp", 1024, K, 5, 60, correlated=model, checkpoints=CKPT).result
    b = run_cell("fthsdp", 1024, K, 5, 60, correlated=model, checkpoints=dataclasses.replace(CKPT, interval_s=600))
    c = run_cell("fthsdp", 1024, K, 5, 60, correlated=model, checkpoints=NO_CKPT).result
    assert a.domain_events == b.result.domain_events == c.domain_events > 0
    assert a.state_losses > 0
    assert c.effective < a.effective  # without checkpoints every loss takes all the progress


def test_command_line_prints_the_correlated_table(capsys):
    assert goodput_sim.main(["--gpus", "1024", "--failures", "4", "--png", "", "--correlated",
                             "--correlated-gpus", "2048", "--correlated-checkpoints", "30"]) == 0
    out = capsys.readouterr().out
    assert "Correlated failures at 2,048 GPUs (16 replicas; kokolis, seed 0)" in out
    table = [line for line in out.splitlines() if line.startswith("| fthsdp (measured costs) |")]
    assert [line.split(" | ")[1] for line in table] == ["none", "every 30 min (+0.17% step time)"]
    assert "all progress so far + 60 min until a give-up" in table[0]
    assert "| synchronous (10 min stall) | in the restart (published) |" in out


def test_the_default_output_has_no_correlated_table(capsys):
    assert goodput_sim.main(["--gpus", "1024", "--failures", "4", "--png", ""]) == 0
    assert "Correlated failures" not in capsys.readouterr().out
