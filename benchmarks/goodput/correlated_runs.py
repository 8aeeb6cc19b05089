"""The correlated-failure table: fthsdp without and with checkpoints against
the synchronous baseline, at one job size (100,000 GPUs by default).

Each row simulates the independent and domain failures with the engine (the
same correlated events in every fthsdp row: their stream does not depend on
the checkpoints) and charges whole-job events, too rare to sample, at their
expected cost (correlated.py): without checkpoints the run keeps only what
it trained after the last one (``kept_share``), with them each costs the
outage and half an interval (``with_whole_job_events``); the synchronous
job restarts in its published 10 minutes, which include the checkpoint load
and the lost work, as for any failure.
"""

from __future__ import annotations

import dataclasses

from benchmarks.goodput import calibration as cal
from benchmarks.goodput import correlated as corr
from benchmarks.goodput import inputs
from benchmarks.goodput.modes import Cell, run_cell


@dataclasses.dataclass(frozen=True)
class Row:
    mode: str
    checkpoints: corr.Checkpoints | None
    """None: the synchronous baseline (its checkpoints inside the restart)."""
    cell: Cell
    """The simulated part: independent and domain failures."""
    event_cost: str
    """What one whole-job event costs, in words."""
    effective: float
    """With whole-job events at their expected cost."""

    @property
    def goodput(self) -> float:
        return self.effective / self.cell.steady_factor

    @property
    def whole_job_share(self) -> float:
        """Share of the simulated effective training time that whole-job events take."""
        simulated = self.cell.result.effective
        return 1 - self.effective / simulated if simulated > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the table assumes (defaults: correlated.py)."""

    correlated: corr.Correlated = corr.Correlated()
    checkpoint_min: tuple[float, ...] = corr.TABLE_CHECKPOINT_MIN
    restore_read_gbs: float = corr.RESTORE_READ_GBS
    restore_s: float | None = None
    """None: the estimate from the state's size and ``restore_read_gbs``."""
    save_cost: float = corr.SAVE_COST
    operator_s: float = corr.OPERATOR_MIN * corr.MIN
    run_days: float = corr.RUN_DAYS
    gpus: int = cal.PUBLISHED_GPUS

    def replicas(self, w: inputs.Workload) -> int:
        return max(2, round(self.gpus / w.replica_gpus))

    def restore_for(self, w: inputs.Workload) -> float:
        if self.restore_s is not None:
            return self.restore_s
        return corr.restore_estimate_s(w.params * w.snapshot_bytes_per_param, self.replicas(w), self.restore_read_gbs)


def _bytes(n: float) -> str:
    return f"{n / 1e15:.2f} PB" if n >= 1e15 else f"{n / 1e12:.2f} TB"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"


def rows(setup: Setup, calibration: cal.Calibration, seed: int, failures: float, workload: inputs.Workload,
         days: float | None = None) -> list[Row]:
    """The table's rows: synchronous, fthsdp without checkpoints, fthsdp with each interval."""
    c = setup.correlated
    simulated = dataclasses.replace(c, whole_job_every_days=0.0)  # whole-job events: charged, not drawn
    rate = c.whole_job_rate_per_s
    restart = workload.replacement_s
    out: list[Row] = []

    sync = run_cell("synchronous", setup.gpus, calibration, seed, failures, workload, days, correlated=simulated)
    sync_restart = cal.PUBLISHED_SYNC_STALL_MIN * corr.MIN
    out.append(Row("synchronous", None, sync, f"a {_minutes(sync_restart)} restart (load and lost work in it)",
                   corr.with_whole_job_events(sync.result.effective, rate, sync_restart)))

    none = corr.Checkpoints(save_cost=setup.save_cost, operator_s=setup.operator_s)
    cell = run_cell("fthsdp", setup.gpus, calibration, seed, failures, workload, days, correlated=simulated,
                    checkpoints=none)
    outage = none.outage_s(restart)
    run_s = setup.run_days * corr.DAY
    out.append(Row("fthsdp", none, cell, f"all progress so far + {_minutes(outage)} until a give-up",
                   cell.result.effective * corr.kept_share(rate, run_s, outage)))

    restore = setup.restore_for(workload)
    for minutes in setup.checkpoint_min:
        ck = corr.Checkpoints(minutes * corr.MIN, restore, setup.save_cost, setup.operator_s)
        cell = run_cell("fthsdp", setup.gpus, calibration, seed, failures, workload, days, correlated=simulated,
                        checkpoints=ck)
        cost = corr.checkpoint_event_cost_s(ck, restart)
        words = (f"{_minutes(restart)} replacement + {_minutes(restore)} restore + {_minutes(ck.interval_s / 2)} "
                 f"lost = {_minutes(cost)}")
        out.append(Row("fthsdp", ck, cell, words, corr.with_whole_job_events(cell.result.effective, rate, cost)))
    return out


def describe(setup: Setup, workload: inputs.Workload, calibration: cal.Calibration, seed: int,
             table_rows: list[Row]) -> str:
    """The paragraph above the table: what it assumes."""
    c = setup.correlated
    w = workload
    first = next(r for r in table_rows if r.mode == "fthsdp")
    replicas = first.cell.replicas
    k = c.domain_replicas(replicas, w.replica_gpus)
    domain = (f"{c.domain_fraction:.0%} of the replicas" if c.domain_fraction > 0
              else f"a domain of {c.domain_gpus:,} GPUs")
    every = f"every {c.whole_job_every_days:g} days on average" if c.whole_job_every_days > 0 else "never"
    state = w.params * w.snapshot_bytes_per_param
    if setup.restore_s is None:
        restore = (f"{replicas} replicas each load the {_bytes(state)} state, "
                   f"{_bytes(replicas * state)} at {setup.restore_read_gbs:,.0f} GB/s in all = "
                   f"{_minutes(setup.restore_for(w))} (an estimate until benchmarks/checkpoint.py measures it)")
    else:
        restore = f"{_minutes(setup.restore_s)} (given)"
    r = first.cell.result
    losses = ""
    if any(x.cell.result.state_losses for x in table_rows):
        losses = (f" In the simulated part domain events left no replica holding the state "
                  f"({', '.join(str(x.cell.result.state_losses) for x in table_rows[1:])} times in the fthsdp rows): "
                  f"with checkpoints the job rolled back, without one it lost everything it had trained since the "
                  f"simulated run began.")
    return (
        f"Correlated failures at {first.cell.gpus:,} GPUs ({replicas} replicas; {calibration.key}, seed {seed}): "
        f"{c.domain_share:.0%} of the failures take {domain} ({k} replica{'s' if k != 1 else ''}) at once, "
        f"stopped like a power loss; a whole-job event (every replica at once) {every}; a run of "
        f"{setup.run_days:g} days. Simulated: the independent and domain failures ({r.failures} failures, "
        f"{r.domain_events} of them domain events, in {r.horizon_s / corr.DAY:.1f} days); whole-job events at "
        f"their expected cost (too rare to sample). Restore: {restore}. A save costs {setup.save_cost:g} of a "
        f"step (assumed); without checkpoints an operator gives the state up {_minutes(setup.operator_s)} after "
        f"the loss (assumed) and the job starts over from step 0.{losses}"
    )
