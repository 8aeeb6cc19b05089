"""Tables (markdown, for stdout and benchmarks/README.md) and the PNG plot."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence

from benchmarks.goodput import calibration as cal
from benchmarks.goodput.correlated_runs import Row
from benchmarks.goodput.modes import MODES, Cell


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def duration(seconds: float) -> str:
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def gpus_label(gpus: int) -> str:
    return f"{gpus:,}"


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(row) + " |" for row in lines)


def standard_error(c: Cell) -> float:
    """The Poisson count's share of the error: the lost time is about
    proportional to the number of failures, whose relative error is 1/sqrt(n)."""
    n = c.result.failures
    return (1 - c.result.effective) / n**0.5 if n else 0.0


def summary_table(cells: Sequence[Cell]) -> str:
    """Effective training time, GPUs down the side, modes across."""
    modes = [m for m in MODES if any(c.mode == m for c in cells)]
    by_size: dict[int, dict[str, Cell]] = collections.defaultdict(dict)
    for c in cells:
        by_size[c.requested][c.mode] = c
    rows = []
    for size in sorted(by_size):
        row = by_size[size]
        rate = next(iter(row.values())).calibration.rate_per_gpu_hour
        rows.append([
            gpus_label(size),
            f"{cal.failures_per_day(rate, size):.1f}",
            duration(cal.mttf_minutes(rate, size) * 60),
            *(pct(row[m].result.effective) if m in row else "-" for m in modes),
        ])
    return markdown(["GPUs", "failures/day", "MTTF", *(MODES[m].label for m in modes)], rows)


def detail_table(cells: Sequence[Cell]) -> str:
    rows = []
    for c in sorted(cells, key=lambda c: (list(MODES).index(c.mode), c.gpus)):
        r = c.result
        rows.append([
            c.mode,
            gpus_label(c.gpus),
            str(c.replicas) if c.mode != "synchronous" else "-",
            f"{r.horizon_s / 86400:.1f}",
            str(r.failures),
            f"{r.failures_per_day:.1f}",
            duration(r.stall_per_failure_s),
            duration(r.replica_out_s) if r.replica_out_s else "-",
            f"{pct(r.effective)} ± {100 * standard_error(c):.1f}",
            pct(c.goodput),
        ])
    header = ["mode", "GPUs", "replicas", "days simulated", "failures", "failures/day",
              "job stall per failure", "replica out per failure", "effective training time",
              "goodput (with steady cost)"]
    return markdown(header, rows)


def correlated_table(rows: Sequence[Row], step_s: float) -> str:
    """fthsdp without and with checkpoints, and the synchronous baseline, under correlated failures."""
    out = []
    for r in rows:
        if r.checkpoints is None:
            label, saving = MODES[r.mode].label, "in the restart (published)"
        elif not r.checkpoints.enabled:
            label, saving = MODES[r.mode].label, "none"
        else:
            label = MODES[r.mode].label
            saving = (f"every {r.checkpoints.interval_s / 60:g} min "
                      f"(+{r.checkpoints.steady_factor(step_s) - 1:.2%} step time)")
        simulated = r.cell.result.effective
        out.append([label, saving, r.event_cost, f"{pct(simulated)} ± {100 * standard_error(r.cell):.1f}",
                    f"{r.whole_job_share:.2%}", pct(r.effective), pct(r.goodput)])
    header = ["mode", "checkpoints", "a whole-job event costs", "effective: failures and domain events (simulated)",
              "lost to whole-job events (expected)", "effective training time", "goodput (with steady costs)"]
    return markdown(header, out, "lllrrrr")


def calibration_table(used: Iterable[cal.Calibration]) -> str:
    rows = [[c.key, f"{c.rate_per_gpu_hour:.3g}", duration(c.mttf_minutes(100_000) * 60),
             duration(c.mttf_minutes(16_384) * 60), c.source] for c in used]
    return markdown(["calibration", "failures per GPU-hour", "MTTF at 100,000", "MTTF at 16,384", "source"],
                    rows, "lrrrl")


def inputs_table(rows: Iterable[tuple[str, str, str]]) -> str:
    return markdown(["input", "value", "source"], [list(r) for r in rows], "lrl")


_LEAVING = re.compile(r"members leaving: .*?\(([^)]*)\)")


def reason_kind(reason: str) -> str:
    """A quorum change's reason, without the replica names and counts."""
    if m := _LEAVING.match(reason):
        return f"shrink ({m.group(1)})"
    if reason.startswith("admitting"):
        return "grow after join_timeout" if "after join_timeout" in reason else "grow"
    return reason.split(":")[0]


def quorum_summary(cells: Sequence[Cell]) -> str:
    """How much of the shipped decision logic the run went through."""
    decided = [c for c in cells if c.result.decisions]
    if not decided:
        return "fthsdp.coordinator.decisions.quorum.decide: not called (no replicated mode ran)."
    kinds = collections.Counter(reason_kind(q.reason) for c in decided for q in c.result.quorum_changes[1:])
    most = max(c.replicas for c in decided)
    decisions = sum(c.result.decisions for c in decided)
    changes = sum(len(c.result.quorum_changes) for c in decided)
    assigned = sum(c.result.catch_up_assignments for c in decided)
    listed = ", ".join(f"{k} {n}" for k, n in kinds.most_common())
    return (f"fthsdp.coordinator.decisions.quorum.decide: {decisions} decisions, {changes} quorum changes "
            f"(up to {most:,} replicas), {assigned} catch-up sources assigned; changes after the first: {listed}.")


def plot(cells: Sequence[Cell], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for mode in MODES:
        mine = sorted((c for c in cells if c.mode == mode), key=lambda c: c.gpus)
        if not mine:
            continue
        xs = [c.gpus for c in mine]
        line, = ax.plot(xs, [100 * c.result.effective for c in mine], marker="o", label=MODES[mode].label)
        if any(c.steady_factor > 1 for c in mine):
            ax.plot(xs, [100 * c.goodput for c in mine], ls="--", color=line.get_color(),
                    label=f"{MODES[mode].label}, with steady cost")
    ax.scatter([cal.PUBLISHED_GPUS] * 2, [100 * cal.PUBLISHED_SYNC_EFFECTIVE, 100 * cal.PUBLISHED_FTHSDP_EFFECTIVE],
               marker="x", s=80, color="black", zorder=5, label="published (arXiv 2602.00277)")
    ax.set_xscale("log")
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("effective training time (%)")
    ax.set_ylim(0, 101)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
