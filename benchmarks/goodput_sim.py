"""Goodput at 1,000 to 200,000 GPUs: a discrete-event simulation of failures.

    python benchmarks/goodput_sim.py [--seed 0] [--failures 100] [--days D]
        [--gpus 1024,...,200000] [--modes synchronous,ft-hsdp,fthsdp,fthsdp-pessimistic]
        [--calibration kokolis|llama3|both] [--png benchmarks/goodput.png]
        [--correlated [--correlated-gpus 100000] [--domain-share 0.08] [--domain-size 1024|N%]
         [--whole-job-every-days 30] [--correlated-checkpoints 10,30,60] [--restore-gbs 1000]
         [--restore-min M] [--save-cost 0.5] [--operator-min 60] [--run-days 30]]

Failures are a Poisson process at a per-GPU rate (calibrations: Kokolis et
al. via the FT-HSDP paper, a failure every ~18 min at 100,000 GPUs = 3.33e-5
per GPU-hour; Llama 3 405B, 419 interruptions in 54 days on 16,384 GPUs =
1.97e-5). Modes:

- synchronous: each failure stalls the whole job 10 minutes (the published
  figure for detection, rescheduling, communicator initialisation,
  checkpoint load and lost work; ``--checkpoint-min`` models lost work apart);
- ft-hsdp: the published FT-HSDP figure, a 3-minute stall per failure, the
  failed replica out for 10 minutes in a job of 8 replicas;
- fthsdp: this project's measured costs (benchmarks/README.md) scaled to a
  405B model in 128-GPU replicas: detection (milliseconds for a crash, the
  heartbeat timeout for a hang that stops its node, the hang limit plus two
  heartbeat intervals for a hang of a live loop, ``--live-hang-share`` of
  the hangs, default 0), fan-out of the new quorum, the FTAR retry of
  the interrupted all-reduce, the catch-up transfer at 400 Gb/s, the admission
  step, the batch at (R - out)/R while replicas are out, failures during
  recoveries (a replica failing again, a joiner's source failing);
- fthsdp-pessimistic: the same with every unmeasured cost at a bad value.

Every membership change of the replicated modes is decided by the shipped
``fthsdp.coordinator.decisions.quorum.decide`` (``goodput.engine`` calls it; it is not
re-implemented), at up to 1,562 replicas.

Accounting (benchmarks/goodput/calibration.py): effective training time =
replica-time spent training / (replicas x wall-clock time); failures keep
arriving during stalls and each costs its own stall (1 - stall/MTTF). That
reproduces the published 44% (10 min every 18 min) exactly; a 3-minute stall
alone gives 83%, and the published 80% needs the failed replica's 10 minutes
out at 1/R of the batch with R = 8 (80.6%), an inference the abstract does
not confirm. Each cell simulates the time in which ``--failures`` failures
are expected (x100 synchronous, x25 ft-hsdp, which cost less to simulate), or
``--days``.

``--correlated`` adds a table (benchmarks/goodput/correlated_runs.py) at
``--correlated-gpus``: failures that take a domain of replicas at once
(``--domain-share`` of them, ``--domain-size`` GPUs or N% of the replicas)
and events that take every replica (``--whole-job-every-days``), for the
synchronous baseline, fthsdp without checkpoints and fthsdp with a checkpoint
every ``--correlated-checkpoints`` minutes. A state loss costs the replicas'
replacement, the restore (``--restore-min``, else every replica loading the
state at ``--restore-gbs`` in all) and the training since the checkpoint;
without checkpoints all progress (the job starts over after an operator's
give-up, ``--operator-min``), over a run of ``--run-days``. Each save costs
``--save-cost`` of a step. Where each default comes from, and which are
assumed: benchmarks/goodput/correlated.py. The other tables do not change.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.goodput import calibration as cal  # noqa: E402
from benchmarks.goodput import correlated as corr  # noqa: E402
from benchmarks.goodput import correlated_runs, inputs, report  # noqa: E402
from benchmarks.goodput.modes import _SHAPE, GPU_COUNTS, MODES, run_cell  # noqa: E402

DEFAULT_PNG = ROOT / "benchmarks" / "goodput.png"


def gpu_count(text: str, least: int = 16) -> int:
    """1024, 100K or 1.5M."""
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:].upper(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = round(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a GPU count: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"at least {least} GPUs, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, inputs.Workload]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--failures", type=float, default=100,
                   help="failures expected per fthsdp cell (x100 synchronous, x25 ft-hsdp); default 100")
    p.add_argument("--days", type=float, help="simulate this many days per cell instead of --failures")
    p.add_argument("--gpus", default=",".join(map(str, GPU_COUNTS)), help="comma-separated job sizes (100K allowed)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    p.add_argument("--calibration", choices=[*cal.CALIBRATIONS, "both"], default="kokolis")
    p.add_argument("--png", default=str(DEFAULT_PNG), help="where to write the plot ('' for none)")
    p.add_argument("--checkpoint-min", type=float, default=0.0,
                   help="synchronous: lose the work since a checkpoint every this many minutes of training, "
                        "on top of the 10-minute stall (default 0: the stall includes it)")
    w = inputs.Workload()
    p.add_argument("--replica-gpus", type=int, default=w.replica_gpus, help="GPUs per fthsdp replica")
    p.add_argument("--nic-gbps", type=float, default=w.nic_gbps, help="network bandwidth per GPU, Gb/s")
    p.add_argument("--step-s", type=float, default=w.step_s, help="training step, seconds")
    p.add_argument("--hang-fraction", type=float, default=w.hang_fraction, help="share of failures that hang")
    p.add_argument("--heartbeat-timeout", type=float, default=w.heartbeat_timeout_s, help="seconds")
    p.add_argument("--live-hang-share", type=float, default=w.live_hang_share,
                   help="share of the hangs that hang a live training loop (seen by the hang verdict, not the "
                        "heartbeat timeout); default 0: every hang stops its node (fthsdp-pessimistic: 1)")
    p.add_argument("--hang-floor", type=float, default=w.hang_floor_s, help="the coordinator's --hang-floor, seconds")
    p.add_argument("--hang-multiple", type=float, default=w.hang_multiple, help="the coordinator's --hang-multiple")
    p.add_argument("--heartbeat-interval", type=float, default=w.heartbeat_interval_s, help="seconds")
    p.add_argument("--allreduce-exposed", type=float, default=w.allreduce_exposed,
                   help="share of the cross-replica all-reduce left exposed beyond the backward pass, charged on "
                        "every step; 0 to 1 (default: measured on CPU, 0.3; fthsdp-pessimistic: 1)")
    g = p.add_argument_group("correlated failures and checkpoints (the --correlated table only; defaults and their "
                             "sources: benchmarks/goodput/correlated.py)")
    g.add_argument("--correlated", action="store_true",
                   help="also print the table of correlated failures at --correlated-gpus")
    g.add_argument("--correlated-gpus", default=str(cal.PUBLISHED_GPUS), help="that table's job size (default 100000)")
    g.add_argument("--domain-share", type=float, default=corr.DOMAIN_SHARE,
                   help="share of the failures that take a whole domain at once (default 0.08: switches and cables, "
                        "of Llama 3's interruptions)")
    g.add_argument("--domain-size", default=str(corr.DOMAIN_GPUS),
                   help="GPUs in a domain, or N%% of the replicas (default 1024, assumed)")
    g.add_argument("--whole-job-every-days", type=float, default=corr.WHOLE_JOB_EVERY_DAYS,
                   help="mean days between events that take every replica; 0: never (default 30, assumed)")
    g.add_argument("--correlated-checkpoints", default=",".join(f"{m:g}" for m in corr.TABLE_CHECKPOINT_MIN),
                   help="the fthsdp rows' checkpoint intervals, minutes of training (default 10,30,60)")
    g.add_argument("--restore-gbs", type=float, default=corr.RESTORE_READ_GBS,
                   help="the checkpoint store's read bandwidth in all, GB/s; every replica loads the whole state "
                        "(default 1000, assumed)")
    g.add_argument("--restore-min", type=float, help="restore time, minutes (default: the estimate from --restore-gbs)")
    g.add_argument("--save-cost", type=float, default=corr.SAVE_COST,
                   help="what one checkpoint save costs, as a share of one step (default 0.5, assumed until "
                        "benchmarks/checkpoint.py measures it)")
    g.add_argument("--operator-min", type=float, default=corr.OPERATOR_MIN,
                   help="without checkpoints: state lost -> an operator's give-up, minutes (default 60, assumed)")
    g.add_argument("--run-days", type=float, default=corr.RUN_DAYS,
                   help="length of the run whose progress is lost without checkpoints (default 30)")
    a = p.parse_args(argv)
    try:
        a.gpu_list = [gpu_count(x.strip()) for x in a.gpus.split(",") if x.strip()]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    a.mode_list = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in a.mode_list if m not in MODES]
    if unknown or not a.mode_list or not a.gpu_list:
        p.error(f"--modes takes {', '.join(MODES)}; --gpus at least one size")
    if a.failures <= 0 or (a.days is not None and a.days <= 0) or a.checkpoint_min < 0:
        p.error("--failures and --days must be positive, --checkpoint-min not negative")
    try:
        a.setup = correlated_setup(a)
    except (ValueError, argparse.ArgumentTypeError) as e:
        p.error(str(e))
    try:
        workload = dataclasses.replace(w, replica_gpus=a.replica_gpus, nic_gbps=a.nic_gbps, step_s=a.step_s,
                                       hang_fraction=a.hang_fraction, heartbeat_timeout_s=a.heartbeat_timeout,
                                       live_hang_share=a.live_hang_share, hang_floor_s=a.hang_floor,
                                       hang_multiple=a.hang_multiple, heartbeat_interval_s=a.heartbeat_interval,
                                       allreduce_exposed=a.allreduce_exposed)
    except ValueError as e:
        p.error(str(e))
    return a, workload


def correlated_setup(a: argparse.Namespace) -> correlated_runs.Setup:
    size = a.domain_size.strip()
    if size.endswith("%"):
        try:
            fraction = float(size[:-1]) / 100
        except ValueError:
            raise ValueError(f"--domain-size: not a share: {size!r}") from None
        model = corr.Correlated(a.domain_share, corr.DOMAIN_GPUS, fraction, a.whole_job_every_days)
        if not fraction > 0:
            raise ValueError("--domain-size: a share above 0%")
    else:
        model = corr.Correlated(a.domain_share, gpu_count(size, least=1), 0.0, a.whole_job_every_days)
    try:
        intervals = tuple(float(x) for x in a.correlated_checkpoints.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--correlated-checkpoints: not minutes: {a.correlated_checkpoints!r}") from None
    if any(m <= 0 for m in intervals):
        raise ValueError("--correlated-checkpoints: intervals must be positive")
    for name in ("restore_gbs", "run_days"):
        if not getattr(a, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    for name in ("restore_min", "save_cost", "operator_min"):
        if (getattr(a, name) or 0) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must not be negative")
    return correlated_runs.Setup(
        model, intervals, a.restore_gbs, None if a.restore_min is None else a.restore_min * 60, a.save_cost,
        a.operator_min * 60, a.run_days, gpu_count(a.correlated_gpus.strip()))


def prediction(cells, workload: inputs.Workload) -> list[str]:
    """fthsdp's figure at 100,000 GPUs and what its losses are made of."""
    lines = []
    for c in cells:
        if c.requested != cal.PUBLISHED_GPUS or not c.mode.startswith("fthsdp"):
            continue
        w = workload if c.mode == "fthsdp" else dataclasses.replace(
            inputs.PESSIMISTIC, **{f: getattr(workload, f) for f in _SHAPE})
        k = inputs.fthsdp_costs(c.replicas, w)
        mttf = cal.mttf_minutes(c.calibration.rate_per_gpu_hour, c.gpus) * 60
        out_loss = (c.result.replica_out_s or 0) / (mttf * c.replicas)
        lines.append(
            f"{c.mode} at {c.gpus:,} GPUs ({c.replicas} replicas, {c.calibration.key}): effective training time "
            f"{report.pct(c.result.effective)} ± {100 * report.standard_error(c):.1f}, goodput with the steady cost "
            f"{report.pct(c.goodput)}. Per failure "
            f"(every {report.duration(mttf)}): failure stall {k.mean_failure_stall_s:.1f} s "
            f"({k.hang_fraction:.0%} hangs, {k.live_hang_share:.0%} of them in a live loop at "
            f"{k.live_hang_stall_s:.1f} s, the rest at {k.hang_stall_s:.1f} s; crashes {k.crash_stall_s:.2f} s), "
            f"serving the joiner {k.serve_stall_s:.1f} s, admission {k.admission_stall_s:.1f} s; the replica out "
            f"{report.duration(c.result.replica_out_s or 0)} costs {report.pct(out_loss)}; every step takes "
            f"{report.pct(k.steady_factor - 1)} longer ({report.pct(inputs.exposed_share(w, inputs.Measured()))} "
            f"of the cross-replica all-reduce left exposed beyond the backward pass).")
    return lines


def main(argv: list[str] | None = None) -> int:
    a, workload = parse_args(argv)
    started = time.perf_counter()
    calibrations = list(cal.CALIBRATIONS.values()) if a.calibration == "both" else [cal.CALIBRATIONS[a.calibration]]
    cells = [
        run_cell(mode, g, c, a.seed, a.failures, workload, a.days, a.checkpoint_min * 60)
        for c in calibrations for mode in a.mode_list for g in a.gpu_list
    ]
    horizon = f"{a.days:g} days per cell" if a.days else f"{a.failures:g} expected failures per fthsdp cell"
    print(f"# Goodput simulation: seed {a.seed}, {horizon}\n")
    print(report.calibration_table(calibrations) + "\n")
    at_100k = round(cal.PUBLISHED_GPUS / workload.replica_gpus)
    print(f"Inputs (fthsdp at {at_100k} replicas of {workload.replica_gpus} GPUs = 100,000 GPUs):\n")
    print(report.inputs_table(inputs.input_rows(at_100k, workload)) + "\n")
    sync = cal.additive_effective(cal.PUBLISHED_SYNC_STALL_MIN, cal.PUBLISHED_MTTF_MIN)
    ft = cal.replicated_effective(cal.PUBLISHED_FTHSDP_STALL_MIN, cal.PUBLISHED_MTTF_MIN,
                                  cal.PUBLISHED_FTHSDP_OUT_MIN, cal.PUBLISHED_FTHSDP_REPLICAS)
    print(f"Accounting at a failure every {cal.PUBLISHED_MTTF_MIN:g} min: synchronous 1 - 10/18 = {report.pct(sync)} "
          f"(published 44%); FT-HSDP 3 min stall + 10 min out of {cal.PUBLISHED_FTHSDP_REPLICAS} replicas = "
          f"{report.pct(ft)} (published 80%).\n")
    for c in calibrations:
        mine = [x for x in cells if x.calibration is c]
        print(f"Effective training time ({c.key}, {c.rate_per_gpu_hour:.3g} failures per GPU-hour):\n")
        print(report.summary_table(mine) + "\n")
    print(report.detail_table(cells) + "\n")
    print(report.quorum_summary(cells) + "\n")
    for line in prediction(cells, workload):
        print(line + "\n")
    if a.correlated:
        rows = correlated_runs.rows(a.setup, calibrations[0], a.seed, a.failures, workload, a.days)
        print(correlated_runs.describe(a.setup, workload, calibrations[0], a.seed, rows) + "\n")
        print(report.correlated_table(rows, workload.step_s) + "\n")
    if a.png:
        title = ("Effective training time vs job size (" + ", ".join(c.key for c in calibrations)
                 + f" calibration, seed {a.seed})")
        report.plot([x for x in cells if x.calibration is calibrations[0]], a.png, title)
        print(f"plot: {a.png}")
    print(f"simulated in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
