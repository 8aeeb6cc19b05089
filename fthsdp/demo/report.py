"""The demo's PNG: loss against step per replica, and the membership timeline.

The timeline has one row per replica, coloured by what the coordinator said
about it at each status poll (a member of the quorum, catching up, failed,
...), with the failure, its detection and the rejoin marked, and the quorum
id written where it changed.
"""

from __future__ import annotations

import logging
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from fthsdp.demo.record import Failure, Recorder

if TYPE_CHECKING:
    from matplotlib.artist import Artist

MarkStyle = Literal["--", ":"]
"""The line styles of the failure's marks on the membership timeline."""

COLOURS = {
    "member": "#2e7d32",
    "catching-up": "#f9a825",
    "joining": "#90a4ae",
    "healthy": "#66bb6a",  # registered and up to date, not (yet) in the quorum
    "failed": "#c62828",
    "draining": "#8e24aa",
    "absent": "#eeeeee",
}
LABELS = {
    "member": "in the quorum",
    "catching-up": "catching up",
    "joining": "joining",
    "healthy": "up to date, not a member",
    "failed": "failed",
    "draining": "leaving",
    "absent": "not registered",
}


def _row_state(sample, replica: str) -> str:
    if replica in sample.members:
        return "member"
    view = sample.replicas.get(replica)
    if view is None:
        return "absent"
    return view.state if view.state in COLOURS else "absent"


def _with_gaps(lines) -> tuple[list[int], list[float]]:
    """Steps and losses, with a break (NaN) where steps are missing, so that a
    replica that was out shows a gap rather than a line across it."""
    steps: list[int] = []
    losses: list[float] = []
    for line in lines:
        if steps and line.step != steps[-1] + 1:
            steps.append(line.step)
            losses.append(float("nan"))
        steps.append(line.step)
        losses.append(line.loss)
    return steps, losses


def _runs(samples, replica: str) -> list[tuple[str, float, float]]:
    """(state, begin, end) for each stretch of polls with the same state."""
    runs: list[tuple[str, float, float]] = []
    for sample, nxt in pairwise(samples):
        state = _row_state(sample, replica)
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1], nxt.t)
        else:
            runs.append((state, sample.t, nxt.t))
    return runs


def write_report(path: Path, rec: Recorder, failure: Failure | None, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # not its font-cache notice in the demo's output
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, (ax_loss, ax_time) = plt.subplots(2, 1, figsize=(11, 8), gridspec_kw={"height_ratios": [3, 2]})
    title = f"fthsdp demo: {len(rec.replica_ids)} replicas of the example GPT"
    f = summary.get("failure") or {}
    all_killed = failure is not None and failure.mode == "kill-all"
    if failure and all_killed:
        title += f", every replica killed after step {failure.step}"
        if f.get("restored_step") is not None:
            title += f", restored from the checkpoint of step {f['restored_step']}"
    elif failure:
        what = {"kill": "killed", "deadlock": "deadlocked"}.get(failure.mode, "hung")
        title += f", {failure.replica} {what} after step {failure.step}"
    fig.suptitle(title)

    for replica in rec.replica_ids:
        steps, losses = _with_gaps(rec.steps[replica])
        ax_loss.plot(steps, losses, ".-", markersize=3, linewidth=1, label=replica, alpha=0.85)
    if failure and all_killed:
        ax_loss.axvline(failure.step, color=COLOURS["failed"], linestyle="--", linewidth=1,
                        label="every replica killed")
        if f.get("committed_steps_lost"):
            ax_loss.axvspan(f["restored_step"], f["last_step_committed"], color=COLOURS["failed"], alpha=0.12,
                            label="steps lost with the state, trained again")
    elif failure:
        ax_loss.axvline(failure.step, color=COLOURS["failed"], linestyle="--", linewidth=1,
                        label=f"{failure.replica} fails")
    if failure and not all_killed and f.get("first_step_trained_again"):
        ax_loss.axvspan(failure.step, f["first_step_trained_again"] - 1, color=COLOURS["failed"], alpha=0.12,
                        label=f"steps without {failure.replica}")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss")
    ax_loss.grid(alpha=0.3)
    if any(rec.steps.values()):
        ax_loss.legend(loc="upper right")

    t0 = rec.started
    samples = rec.samples
    used = set()
    for row, replica in enumerate(rec.replica_ids):
        for state, begin, end in _runs(samples, replica):
            used.add(state)
            ax_time.barh(row, end - begin, left=begin - t0, height=0.6, color=COLOURS[state], linewidth=0)
    previous, shown = None, 0
    for sample in samples:
        if sample.quorum_id and sample.quorum_id != previous:
            ax_time.axvline(sample.t - t0, color="#555555", linewidth=0.6, alpha=0.6)
            # Staggered: quorums formed a moment apart would print over each other.
            ax_time.text(sample.t - t0, len(rec.replica_ids) - 0.55 + 0.2 * (shown % 2), f" q{sample.quorum_id}",
                         fontsize=8, ha="left")
            previous, shown = sample.quorum_id, shown + 1
    marks: list[tuple[float, str, str, MarkStyle]] = []
    if failure:
        marks.append((failure.t, "every replica killed" if all_killed else "failure", COLOURS["failed"], "--"))
        if f.get("time_to_restore_s") is not None:
            marks.append((failure.t + f["time_to_restore_s"], "checkpoint restored", "#ef6c00", ":"))
        if f.get("time_to_detect_s") is not None:
            marks.append((failure.t + f["time_to_detect_s"], "detected", "#ef6c00", ":"))
        if f.get("time_to_rejoin_quorum_s") is not None:
            marks.append((failure.t + f["time_to_rejoin_quorum_s"], "back in the quorum", COLOURS["member"], ":"))
        if f.get("time_to_recover_s") is not None:
            marks.append((failure.t + f["time_to_recover_s"], "training again", "#1565c0", ":"))
    for t, _label, colour, style in marks:
        ax_time.axvline(t - t0, color=colour, linestyle=style, linewidth=1.5)
    ax_time.set_yticks(range(len(rec.replica_ids)), rec.replica_ids)
    ax_time.set_ylim(-0.5, len(rec.replica_ids) - 0.05)
    ax_time.set_xlabel("seconds since the demo started")
    ax_time.set_title("membership (coordinator status; q = quorum id)", fontsize=10)
    handles: list[Artist] = [Patch(color=COLOURS[s], label=LABELS[s]) for s in COLOURS if s in used]
    handles += [plt.Line2D([], [], color=c, linestyle=st, label=label) for _, label, c, st in marks]
    if handles:  # none when the demo failed before the coordinator answered
        ax_time.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=min(6, len(handles)),
                       fontsize=8)

    if all_killed and f.get("time_to_recover_s") is not None:
        fig.text(0.01, 0.01, f"restored step {f['restored_step']} {f['time_to_restore_s']:.1f} s after the kill "
                 f"({f['committed_steps_lost']} committed steps lost), recover {f['time_to_recover_s']:.1f} s, "
                 f"effective training time {100 * summary['effective_training_time']:.1f}%, steps lost "
                 f"{summary['steps_lost']}, redone {summary.get('replica_steps_redone', 0)}", fontsize=8)
    elif f.get("time_to_recover_s") is not None:
        fig.text(0.01, 0.01, f"detect {f['time_to_detect_s'] * 1000:.0f} ms, recover {f['time_to_recover_s']:.1f} s, "
                 f"catch-up {f['catch_up_bytes'] / 2**20:.1f} MiB, effective training time "
                 f"{100 * summary['effective_training_time']:.1f}%, steps lost {summary['steps_lost']}", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
