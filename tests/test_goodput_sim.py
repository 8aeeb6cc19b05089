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

import fthsdp.coordinator.decisions.quorum
import fthsdp.coordinator.decisions.quorum_types

# benchmarks/ is not an installed package: import it from the checkout, as
# `python benchmarks/goodput_sim.py` does, whichever way pytest was started.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import goodput_sim  # noqa: E402
from benchmarks.goodput import calibration as cal  # noqa: E402
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
    assert engine.decide is fthsdp.coordinator.decisions.quorum.decide
    assert engine.Rules is fthsdp.coordinator.decisions.quorum_types.Rules


def test_membership_is_what_the_decision_returns(monkeypatch):
    returned = []

    def spy(*args, **kwargs):
        d = fthsdp.coordinator.decisions.quorum.decide(*args, **kwargs)
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
    # The hang limit (max(10 s, 5 x 6 s)) plus three heartbeat intervals (16 groups: not stretched),
    # and the shrink's own costs.
    costs = inputs.fthsdp_costs(16, live)
    assert costs.live_hang_detect_s == pytest.approx(33.0)
    assert costs.live_hang_stall_s - costs.crash_stall_s == pytest.approx(33.0 - 0.01)
    assert costs.mean_failure_stall_s == pytest.approx(costs.live_hang_stall_s)


def test_live_hang_share_zero_leaves_the_default_run_as_it_was():
    # No extra draw: the stopped-node model's runs are unchanged by the new parameter.
    a = _run(3, gpus=2048, failures=10)
    b = _run(3, gpus=2048, failures=10, workload=dataclasses.replace(inputs.Workload(), hang_floor_s=1.0))
    assert a.result == b.result


@pytest.mark.parametrize("floor, multiple, expected", [(10.0, 5.0, 33.0), (1.0, 3.0, 21.0), (40.0, 5.0, 43.0)])
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
        (inputs.Measured().fanout_s(62), 0.11),
        (inputs.Measured().fanout_s(250), 0.67),
        (inputs.transfer_s(inputs.Workload(), inputs.Measured()), 405e9 * 12 / 128 / (50e9 * 0.91)),
        (inputs.allreduce_s(inputs.Workload(), 2), 405e9 * 2 / 128 / 50e9),
        (inputs.fthsdp_costs(781).admission_stall_s, 0.35 * 6),
        # A stopped node at 781 groups of 16 hosts: each group's rank 0 and its host 0's batches, 1,562
        # senders, inside the 5,000/s budget: the configured 1 s / 5 s.
        (inputs.pace_at(inputs.Workload(), 781).timeout, 5.0),
        (inputs.pace_at(inputs.Workload(), 781).interval, 1.0),
        (inputs.pace_at(inputs.Workload(), 3000).interval, 1.25),
        (inputs.fthsdp_costs(781).hang_stall_s - inputs.fthsdp_costs(781).crash_stall_s, 0.68 + 4.0 - 0.01),
        (inputs.fthsdp_costs(781).live_hang_detect_s, 30 + 3 * 1.0),
        (inputs.published_costs().crash_stall_s, 180),
        # The steady cost: the measured exposed share (314.9 - 293) / (344 - 293) of the all-reduce,
        # all of it where assumed not overlapped.
        (inputs.Measured().allreduce_exposed, 21.9 / 51),
        (inputs.fthsdp_costs(781).steady_factor, 1 + 21.9 / 51 * inputs.allreduce_s(inputs.Workload(), 781) / 6),
        (inputs.fthsdp_costs(781, inputs.PESSIMISTIC).steady_factor,
         1 + inputs.allreduce_s(inputs.Workload(), 781) / 6),
        (inputs.Measured(overlapped_step_ms=290.0).allreduce_exposed, 0.0),
        (inputs.fthsdp_costs(781, inputs.Workload(allreduce_exposed=0.0)).steady_factor, 1.0),
        (inputs.Measured(overlapped_step_ms=440.0).allreduce_exposed, 1.0),
    ],
)
def test_costs(got, expected):
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    "field, value",
    [("hang_fraction", 1.5), ("replica_gpus", 0), ("nic_gbps", 0), ("replacement_s", -1), ("serve_gbps", 0.0),
     ("live_hang_share", -0.1), ("hang_floor_s", 0.0), ("allreduce_exposed", 1.5)],
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
    assert "fthsdp.coordinator.decisions.quorum.decide:" in out
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
        (["--allreduce-exposed", "1.5"], "allreduce_exposed"),
        (["--correlated", "--domain-share", "2"], "domain_share"),
        (["--correlated", "--domain-size", "0%"], "a share above 0%"),
        (["--correlated", "--domain-size", "lots"], "not a GPU count"),
        (["--correlated", "--correlated-checkpoints", "0"], "must be positive"),
        (["--correlated", "--restore-gbs", "0"], "--restore-gbs must be positive"),
        (["--correlated", "--save-cost", "-1"], "--save-cost must not be negative"),
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
