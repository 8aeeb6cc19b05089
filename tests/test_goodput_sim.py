"""The goodput simulator (benchmarks/goodput_sim.py): calibration against the
published figures, determinism, and that membership goes through the shipped
quorum decision."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from itertools import pairwise
from pathlib import Path

import pytest

import fthsdp.coordinator.quorum
import fthsdp.coordinator.quorum_types

# benchmarks/ is not an installed package: import it from the checkout, as
# `python benchmarks/goodput_sim.py` does, whichever way pytest was started.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import goodput_sim  # noqa: E402
from benchmarks.goodput import calibration as cal  # noqa: E402
from benchmarks.goodput import correlated as corr  # noqa: E402
from benchmarks.goodput import engine, inputs, report, synchronous  # noqa: E402
from benchmarks.goodput.modes import run_cell  # noqa: E402

K = cal.KOKOLIS


@pytest.mark.parametrize(
    "got, expected",
    [
        (cal.KOKOLIS.rate_per_gpu_hour, 1 / (0.3 * 100_000)),
        (cal.KOKOLIS.mttf_minutes(100_000), 18.0),
        (cal.KOKOLIS.mttf_minutes(131_072), 13.73),  # Kokolis: ~14 min
        (cal.KOKOLIS.mttf_minutes(16_384) / 60, 1.83),  # Kokolis: ~1.8 h
        (cal.LLAMA3.rate_per_gpu_hour, 1.973e-5),
        (cal.LLAMA3.mttf_minutes(16_384), 54 * 24 * 60 / 419),  # one every ~3.1 h
        (cal.failures_per_day(cal.KOKOLIS.rate_per_gpu_hour, 100_000), 80.0),
    ],
)
def test_calibration(got, expected):
    assert got == pytest.approx(expected, rel=2e-3)


@pytest.mark.parametrize(
    "accounting, args, expected",
    [
        (cal.additive_effective, (10, 18), 0.4444),  # the published synchronous 44%
        (cal.additive_effective, (3, 18), 0.8333),  # not the published 80%
        (cal.additive_effective, (20, 18), 0.0),  # stalls outrun failures: no training
        (cal.renewal_effective, (10, 18), 0.6429),
        (cal.restart_effective, (10, 18), 0.5738),
        (cal.replicated_effective, (3, 18, 10, 8), 0.8058),  # the published FT-HSDP 80%, inferred
        (cal.replicated_effective, (3, 18, 10, 16), 0.8192),
        (cal.replicated_effective, (3, 18, 10, 10**9), 0.8333),  # infinitely many replicas: the additive figure
    ],
)
def test_accountings(accounting, args, expected):
    assert accounting(*args) == pytest.approx(expected, abs=1e-4)


def test_replicated_accounting_rejects_a_replica_back_before_the_stall_ends():
    with pytest.raises(ValueError, match="before the stall ends"):
        cal.replicated_effective(3, 18, 2, 8)


def test_simulation_reproduces_the_published_synchronous_44_percent():
    cell = run_cell("synchronous", cal.PUBLISHED_GPUS, K, seed=0, failures=200)  # 20,000 failures
    assert cell.result.failures > 15_000
    assert cell.result.stall_per_failure_s == pytest.approx(600)
    assert abs(cell.result.effective - cal.PUBLISHED_SYNC_EFFECTIVE) <= 0.02


def test_simulation_reproduces_the_published_ft_hsdp_80_percent():
    cell = run_cell("ft-hsdp", cal.PUBLISHED_GPUS, K, seed=0, failures=120)  # 3,000 failures, 8 replicas
    assert cell.replicas == cal.PUBLISHED_FTHSDP_REPLICAS
    assert abs(cell.result.effective - cal.PUBLISHED_FTHSDP_EFFECTIVE) <= 0.02
    # ... and agrees with the closed form it is documented by.
    closed = cal.replicated_effective(3, 18, 10, cal.PUBLISHED_FTHSDP_REPLICAS)
    assert abs(cell.result.effective - closed) <= 0.01
    # Failures that land on a replica already out stall nobody.
    assert cell.result.stall_per_failure_s < 180


@pytest.mark.parametrize("stall_min, mttf_min", [(10, 18), (3, 18), (1, 60), (12, 9)])
def test_synchronous_engine_follows_the_additive_accounting(stall_min, mttf_min):
    gpus = 100_000
    rate = cal.rate_from_mttf(mttf_min, gpus)
    horizon = 20_000 * mttf_min * 60
    r = synchronous.simulate_synchronous(gpus, rate, horizon, random.Random(1), stall_min * 60)
    assert r.effective == pytest.approx(cal.additive_effective(stall_min, mttf_min), abs=0.02)


def test_synchronous_engine_loses_the_work_since_the_last_checkpoint():
    # Rare failures (every 100 h), a checkpoint every hour of training: on
    # average half an hour is lost on top of the 10-minute restart.
    gpus = 1000
    rate = cal.rate_from_mttf(100 * 60, gpus)
    r = synchronous.simulate_synchronous(gpus, rate, 4000 * 100 * 3600, random.Random(2), 600,
                                         checkpoint_interval_s=3600)
    assert r.stall_per_failure_s == pytest.approx(600 + 1800, abs=60)


DEFAULT_WORKLOAD = inputs.Workload()


def _run(seed: int, gpus: int = 16_384, failures: float = 30, workload: inputs.Workload = DEFAULT_WORKLOAD):
    return run_cell("fthsdp", gpus, K, seed, failures, workload)


def test_same_seed_same_run_other_seed_other_run():
    a, b, c = _run(1), _run(1), _run(2)
    assert a == b
    assert a.result.quorum_changes == b.result.quorum_changes
    assert a.result != c.result
    assert a.result.failures != c.result.failures or a.result.effective != c.result.effective


def test_the_simulator_calls_the_shipped_quorum_decision():
    assert engine.decide is fthsdp.coordinator.quorum.decide
    assert engine.Rules is fthsdp.coordinator.quorum_types.Rules


def test_membership_is_what_the_decision_returns(monkeypatch):
    returned = []

    def spy(*args, **kwargs):
        d = fthsdp.coordinator.quorum.decide(*args, **kwargs)
        returned.append(d)
        return d

    monkeypatch.setattr(engine, "decide", spy)
    cell = _run(3, failures=10)
    r = cell.result
    assert r.decisions == len(returned) > 0
    formed = [d for d in returned if d.changes_quorum]
    assert [q.reason for q in r.quorum_changes] == [d.reason for d in formed]
    assert [q.members for q in r.quorum_changes] == [len(d.members) for d in formed]
    assert [q.quorum_id for q in r.quorum_changes] == list(range(1, len(formed) + 1))


def test_a_run_at_1024_replicas_shrinks_on_failures_and_grows_on_recoveries():
    cell = run_cell("fthsdp", 131_072, K, seed=4, failures=6)
    r = cell.result
    assert cell.replicas == 1024
    first, *changes = r.quorum_changes
    assert first.members == 1024 and first.reason.startswith("admitting r0000, r0001")
    kinds = {report.reason_kind(q.reason) for q in changes}
    assert kinds & {"shrink (reported failed)", "shrink (stream closed)", "shrink (heartbeat timeout)"}
    assert "grow" in kinds
    for before, q in pairwise(r.quorum_changes):
        if q.reason.startswith("members leaving"):
            assert q.members < before.members
        else:
            assert q.members > before.members
    assert r.catch_up_assignments > 0  # every joiner was given a source by the decision


def test_silent_failures_leave_by_heartbeat_timeout():
    hanging = dataclasses.replace(inputs.Workload(), hang_fraction=1.0)
    r = _run(5, gpus=2048, failures=10, workload=hanging).result
    shrinks = [q.reason for q in r.quorum_changes if q.reason.startswith("members leaving")]
    assert shrinks and all("(heartbeat timeout)" in s for s in shrinks)


def test_live_loop_hangs_leave_by_the_hang_verdict():
    live = dataclasses.replace(inputs.Workload(), hang_fraction=1.0, live_hang_share=1.0)
    r = _run(5, gpus=2048, failures=10, workload=live).result
    shrinks = [q.reason for q in r.quorum_changes if q.reason.startswith("members leaving")]
    assert shrinks and all("(hung: no progress" in s for s in shrinks)
    # The hang limit (max(10 s, 5 x 6 s)) plus two heartbeat intervals, and the shrink's own costs.
    costs = inputs.fthsdp_costs(16, live)
    assert costs.live_hang_detect_s == pytest.approx(32.0)
    assert costs.live_hang_stall_s - costs.crash_stall_s == pytest.approx(32.0 - 0.01)
    assert costs.mean_failure_stall_s == pytest.approx(costs.live_hang_stall_s)


def test_live_hang_share_zero_leaves_the_default_run_as_it_was():
    # No extra draw: the stopped-node model's runs are unchanged by the new parameter.
    a = _run(3, gpus=2048, failures=10)
    b = _run(3, gpus=2048, failures=10, workload=dataclasses.replace(inputs.Workload(), hang_floor_s=1.0))
    assert a.result == b.result


@pytest.mark.parametrize("floor, multiple, expected", [(10.0, 5.0, 32.0), (1.0, 3.0, 20.0), (40.0, 5.0, 42.0)])
def test_live_hang_detection_follows_the_hang_settings(floor, multiple, expected):
    w = dataclasses.replace(inputs.Workload(), hang_floor_s=floor, hang_multiple=multiple)
    assert w.live_hang_detect_s == pytest.approx(expected)


def test_fthsdp_loses_less_than_the_published_figures_at_100k():
    fthsdp = run_cell("fthsdp", cal.PUBLISHED_GPUS, K, seed=0, failures=15).result
    assert fthsdp.effective > 0.95
    assert 0 < fthsdp.stall_per_failure_s < 60
    assert fthsdp.replica_out_s == pytest.approx(inputs.Workload().replacement_s, rel=0.1)


@pytest.mark.parametrize(
    "got, expected",
    [
        (inputs.Measured().fanout_s(100), 0.009),
        (inputs.Measured().fanout_s(1000), 0.264),
        (inputs.transfer_s(inputs.Workload(), inputs.Measured()), 405e9 * 12 / 128 / (50e9 * 0.91)),
        (inputs.allreduce_s(inputs.Workload(), 2), 405e9 * 2 / 128 / 50e9),
        (inputs.fthsdp_costs(781).admission_stall_s, 0.35 * 6),
        (inputs.fthsdp_costs(781).hang_stall_s - inputs.fthsdp_costs(781).crash_stall_s, 4.68 - 0.01),
        (inputs.published_costs().crash_stall_s, 180),
    ],
)
def test_costs(got, expected):
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    "field, value",
    [("hang_fraction", 1.5), ("replica_gpus", 0), ("nic_gbps", 0), ("replacement_s", -1), ("serve_gbps", 0.0),
     ("live_hang_share", -0.1), ("hang_floor_s", 0.0)],
)
def test_workload_rejects_nonsense(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(inputs.Workload(), **{field: value})


@pytest.mark.parametrize(
    "reason, kind",
    [
        ("members leaving: r7 (stream closed). [7 alive; 1 lost]", "shrink (stream closed)"),
        ("members leaving: r1 (heartbeat timeout); admitting r2. [..]", "shrink (heartbeat timeout)"),
        ("admitting r4: no other replica pending. [8 alive]", "grow"),
        ("admitting r4 after join_timeout 10s; 1 still catching up. [..]", "grow after join_timeout"),
    ],
)
def test_reason_kind(reason, kind):
    assert report.reason_kind(reason) == kind


def test_command_line_prints_the_tables_and_writes_the_plot(tmp_path, capsys):
    png = tmp_path / "g.png"
    assert goodput_sim.main(["--gpus", "1024,16384", "--failures", "4", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| 16,384 | 13.1 |" in out
    assert "synchronous 1 - 10/18 = 44.4%" in out
    assert "fthsdp.coordinator.quorum.decide:" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpus", "10"], "at least 16 GPUs"),
        (["--gpus", "lots"], "not a GPU count"),
        (["--modes", "async"], "--modes takes"),
        (["--failures", "0"], "must be positive"),
        (["--hang-fraction", "2"], "hang_fraction"),
        (["--heartbeat-timeout", "0"], "heartbeat_timeout_s"),
    ],
)
def test_command_line_rejects_bad_input_with_a_message(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        goodput_sim.main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_standard_error_shrinks_with_the_failure_count():
    few, many = _run(6, failures=5), _run(6, failures=40)
    assert report.standard_error(many) < report.standard_error(few)
    assert math.isfinite(report.standard_error(few))


# ----- correlated failures and checkpoints (benchmarks/goodput/correlated.py) ---------------

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


@pytest.mark.parametrize(
    "args, message",
    [
        (["--domain-share", "2"], "domain_share"),
        (["--domain-size", "0%"], "a share above 0%"),
        (["--domain-size", "lots"], "not a GPU count"),
        (["--correlated-checkpoints", "0"], "must be positive"),
        (["--restore-gbs", "0"], "--restore-gbs must be positive"),
        (["--save-cost", "-1"], "--save-cost must not be negative"),
    ],
)
def test_correlated_options_reject_bad_input(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        goodput_sim.main(["--correlated", *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
