"""The accuracy benchmark's plot: the runs' loss curves against samples trained on."""

from __future__ import annotations

from benchmarks.accuracy_job import JobResult

SMOOTH_STEPS = 15
"""Training losses are each replica's own batch: averaged over this many steps to be readable."""


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(results: list[JobResult], path: str, title: str) -> None:
    """Training loss (smoothed) and validation loss against samples, the
    validation losses of the second half zoomed in with the 1% band around
    the failure-free run's final one, and the replicas contributing per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(12, 7.5))
    grid = fig.add_gridspec(2, 2, height_ratios=(3, 1), hspace=0.3, wspace=0.22)
    curves, zoom, members = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
    colors = ["black", "tab:red", "tab:blue", "tab:gray", "tab:purple"]
    styles = ["-", "-", "-", ":", "--"]
    half = results[0].samples / 2
    for r, color, style in zip(results, colors, styles, strict=False):  # styles for up to five runs
        x = [s for s, _ in r.train]
        curves.plot(x, _moving_average([loss for _, loss in r.train], SMOOTH_STEPS), style, color=color, lw=1.2,
                    alpha=0.8, label=r.name)
        curves.plot(*zip(*r.val, strict=True), "o", color=color, ms=4)
        late = [(s, v) for s, v in r.val if s >= half]
        zoom.plot(*zip(*late, strict=True), "o" + style, color=color, ms=5, lw=1, label=r.name)
        offset = 0.05 * (len(members.lines) - len(results) / 2)  # overlapping lines stay apart
        members.step(x, [n + offset for n in r.contributors], where="pre", color=color, lw=1.2, alpha=0.8,
                     label=r.name)
    base = results[0].final_val
    zoom.axhspan(base * 0.99, base * 1.01, color="tab:green", alpha=0.15, label="failure-free final ± 1%")
    curves.set(xlabel="samples trained on (all replicas)", ylabel="loss (nats per character)", yscale="log",
               title=f"lines: training loss (mean of {SMOOTH_STEPS} steps); dots: validation loss")
    zoom.set(xlabel="samples trained on", ylabel="validation loss", title="validation loss, second half")
    members.set(xlabel="samples trained on", ylabel="replicas", title="replicas contributing a gradient per step",
                yticks=[1, 2, 3], ylim=(0.5, 3.5))
    curves.legend(fontsize=8)
    zoom.legend(fontsize=8)
    members.legend(fontsize=7, loc="lower right", ncol=len(results))
    for ax in (curves, zoom, members):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
