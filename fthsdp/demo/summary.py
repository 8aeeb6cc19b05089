"""The demo's figures, computed from what was recorded (a pure function), and their text.

Definitions (also in docs/demo.md and the JSON's ``definitions``):

* **effective training time**: the replica-seconds spent training steps that
  were committed, over the replica-seconds available (replicas × the time from
  the first replica's admission to the last committed step). A replica
  trains step s+1 from its commit of step s to its commit of s+1; the time a
  replica is dead, restarting, catching up or waiting for admission counts as
  lost, and so does the step a killed replica was in.
* **steps lost**: replica-steps never trained: for each step, the replicas of
  the job that did not contribute a gradient to it (the failed replica's
  batches while it was out; the global batch shrank, no batch was repeated).
  Committed steps are never lost or redone: the survivors go on from where they were.
* **time to detect**: from the failure to the coordinator's new quorum
  without the replica (the quorum's own creation time, in milliseconds).
* **time to recover**: from the failure to the commit of the first step the
  replica trained with the others again (restarted, caught up, admitted at a
  step boundary); ``time_to_rejoin_quorum_s`` is when the coordinator's
  quorum had it again.
* **bytes transferred**: the snapshot the restarted replica fetched from its
  source (its own report; the coordinator's status shows the same progress).

With ``--fail-mode kill-all`` every replica is killed: the steps committed
after the restored checkpoint are lost with the state and trained again.
Their first training counts as neither trained steps nor effective time
(it is as if it never happened: *steps lost* counts each step once, by its
training after the restore) and is reported as ``replica_steps_redone``. The
failure's figures are then the restore's: ``time_to_restore_s`` (kill to the
coordinator's restore decision), ``time_to_rejoin_quorum_s`` (kill to the
quorum of every replica again), ``time_to_recover_s`` (kill to the commit of
the first step every replica trained again).
"""

from __future__ import annotations

import statistics
from itertools import pairwise

from fthsdp.demo.record import Failure, RankStart, Recorder, StatusSample, StepLine, short_reason

DEFINITIONS = {
    "effective_training_time": "replica-seconds spent training steps that were committed / "
                               "(replicas x seconds from the first admission to the last committed step)",
    "steps_lost": "replica-steps never trained: per step, replicas that contributed no gradient to it",
    "time_to_detect_s": "failure -> the coordinator's quorum without the failed replica (its creation time)",
    "time_to_recover_s": "failure -> the commit of the first step the failed replica trained with the others again",
    "catch_up_bytes": "bytes of the snapshot the restarted replica fetched from a healthy peer",
    "replica_steps_redone": "kill-all: replica-steps committed after the restored checkpoint, lost with the "
                            "state and trained again (their first training counts as lost time, not as trained)",
    "time_to_restore_s": "kill-all: the kill -> the coordinator's decision to restore the newest checkpoint",
}


def _quorum_time(sample: StatusSample, wall_offset: float) -> float:
    """When the coordinator formed the sample's quorum, on the monotonic clock
    (the poll time if the quorum carries no timestamp)."""
    if sample.quorum_created_unix_ms > 0:
        return sample.quorum_created_unix_ms / 1000.0 - wall_offset
    return sample.t


def _effective_seconds(rec: Recorder, replica: str, lines: list[StepLine]) -> float:
    """Seconds this replica spent training the steps ``lines`` it committed one after the other."""
    marks = sorted([(s.t, s.start_step) for s in rec.starts[replica]] + [(line.t, line.step) for line in lines])
    return sum(t - t_prev for (t_prev, step_prev), (t, step) in pairwise(marks) if step == step_prev + 1)


def _restore(rec: Recorder, failure: Failure | None) -> StatusSample | None:
    """kill-all: the first status showing the coordinator's restore after the kill."""
    if failure is None or failure.mode != "kill-all":
        return None
    return next((s for s in rec.samples if s.t >= failure.t and s.restored_step
                 and s.restore_unix_ms >= int(failure.wall * 1000)), None)


def _restart(rec: Recorder, replica: str, failure: Failure) -> RankStart | None:
    """The replica's first training process started after the failure."""
    return next((s for s in rec.starts[replica] if s.t > failure.t), None)


def _kept_and_redone(rec: Recorder, failure: Failure | None) -> tuple[dict[str, list[StepLine]], list[StepLine]]:
    """Each replica's committed steps that count, and (kill-all, once restored)
    those lost with the state: committed after the restored checkpoint by the
    processes that were killed, and trained again after the restore."""
    restore = _restore(rec, failure)
    if restore is None or failure is None:
        return {r: list(lines) for r, lines in rec.steps.items()}, []
    kept: dict[str, list[StepLine]] = {}
    redone: list[StepLine] = []
    for replica, lines in rec.steps.items():
        restart = _restart(rec, replica, failure)
        before = restart.t if restart else float("inf")
        kept[replica] = [line for line in lines if not (line.t < before and line.step > restore.restored_step)]
        redone += [line for line in lines if line.t < before and line.step > restore.restored_step]
    return kept, redone


def _contributors(lines: list[StepLine]) -> dict[int, int]:
    """Per step, the replicas that contributed a gradient to it (the most any line reports)."""
    out: dict[int, int] = {}
    for line in lines:
        out[line.step] = max(out.get(line.step, 0), line.contributors)
    return out


def summarize(rec: Recorder, failure: Failure | None, replicas: int, steps: int) -> dict:
    """Every figure of the summary, as a JSON-ready dict."""
    out: dict = {"replicas": replicas, "steps": steps, "definitions": DEFINITIONS}
    out["final_steps"] = {r: rec.done.get(r) for r in rec.replica_ids}
    out["all_reached_final_step"] = all(rec.done.get(r) == steps for r in rec.replica_ids)

    kept, redone = _kept_and_redone(rec, failure)
    contributors = _contributors([line for lines in kept.values() for line in lines])
    trained = sum(contributors.get(s, 0) for s in range(1, steps + 1))
    out["replica_steps_total"] = replicas * steps
    out["replica_steps_trained"] = trained
    out["steps_lost"] = replicas * steps - trained
    out["replica_steps_redone"] = sum(_contributors(redone).values())

    starts = [s.t for ss in rec.starts.values() for s in ss]
    ends = [lines[-1].t for lines in rec.steps.values() if lines]
    window = (max(ends) - min(starts)) if starts and ends else 0.0
    out["training_wall_s"] = round(window, 3)
    effective = sum(_effective_seconds(rec, r, kept[r]) for r in rec.replica_ids)
    out["effective_training_time"] = round(effective / (replicas * window), 4) if window > 0 else 0.0

    quorums: list[dict] = []
    for sample in rec.samples:
        if sample.quorum_id and (not quorums or quorums[-1]["id"] != sample.quorum_id):
            quorums.append({"id": sample.quorum_id, "members": list(sample.members), "reason": sample.quorum_reason,
                            "t": round(_quorum_time(sample, rec.wall_offset) - rec.started, 3)})
    out["quorum_history"] = quorums
    if failure is None:
        out["failure"] = None
    elif failure.mode == "kill-all":
        out["failure"] = _restore_figures(rec, failure, kept, redone)
    else:
        out["failure"] = _failure_figures(rec, failure)
    return out


def _median_step(rec: Recorder, replicas: list[str], failure: Failure) -> float | None:
    """The median time between two committed steps of ``replicas``, leaving out the gaps around the failure."""
    intervals = [line.t - prev.t for r in replicas for prev, line in pairwise(rec.steps[r])
                 if line.step == prev.step + 1 and not prev.t <= failure.t <= line.t]
    return round(statistics.median(intervals), 3) if intervals else None


def _restore_figures(rec: Recorder, failure: Failure, kept: dict[str, list[StepLine]],
                     redone: list[StepLine]) -> dict:
    """kill-all: every replica killed at once; the checkpoint restored, and how
    long until every replica was in one quorum and trained again."""
    ids = list(rec.replica_ids)
    fig: dict = {"replica": "all", "replicas": ids, "mode": failure.mode, "step": failure.step,
                 "pid": failure.pid, "pids": dict(failure.pids), "quorum_before": failure.quorum_before}
    restore = _restore(rec, failure)
    fig["restored"] = restore is not None
    fig["restored_step"] = restore.restored_step if restore else None
    fig["checkpoint_path"] = restore.restored_path if restore else ""
    fig["lost_step"] = restore.lost_step if restore else None
    # The coordinator's lost step is the newest it had heard of (heartbeats lag a step or so);
    # the replicas' own lines say which steps they committed before they were killed.
    last = max([failure.step] + [line.step for line in redone])
    fig["last_step_committed"] = max(last, restore.lost_step) if restore else last
    fig["committed_steps_lost"] = fig["last_step_committed"] - restore.restored_step if restore else None
    fig["requested_by"] = restore.restore_requested_by if restore else ""
    fig["time_to_restore_s"] = round(restore.restore_unix_ms / 1000 - failure.wall, 3) if restore else None

    restarts = {r: start for r in ids if (start := _restart(rec, r, failure))}
    fig["restarted"] = len(restarts) == len(ids)
    counts = {r: max((s.replicas[r].restart_count for s in rec.samples if s.t >= failure.t and r in s.replicas),
                     default=0) for r in ids}
    fig["restart_counts"] = counts
    fig["restart_count"] = min(counts.values(), default=0)
    restored = restore.restored_step if restore else None
    fig["loaded_checkpoint"] = [r for r, s in restarts.items() if not s.catch_up and s.start_step == restored]
    fig["caught_up_from"] = {r: (s.catch_up or {}).get("source", "") for r, s in restarts.items() if s.catch_up}

    back = next((s for s in rec.samples if restore and s.t >= restore.t and s.quorum_id > failure.quorum_before
                 and set(s.members) == set(ids)), None)
    fig["quorum_rejoined"] = back.quorum_id if back else None
    fig["quorum_rejoined_step"] = back.quorum_step if back else None
    fig["time_to_rejoin_quorum_s"] = round(_quorum_time(back, rec.wall_offset) - failure.t, 3) if back else None
    fig["rejoin_reason"] = back.quorum_reason if back else ""
    # Recovered: a step committed after the restore with every replica's gradient in it.
    together = [line for r, start in restarts.items() for line in kept[r]
                if line.t > start.t and line.contributors >= len(ids)]
    first = min((line.step for line in together), default=None) if back and fig["restarted"] else None
    commits = [line.t for line in together if line.step == first]
    fig["first_step_trained_again"] = first
    fig["time_to_recover_s"] = round(max(commits) - failure.t, 3) if first is not None and commits else None
    fig["median_step_s"] = _median_step(rec, ids, failure)
    return fig


def _failure_figures(rec: Recorder, failure: Failure) -> dict:
    victim = failure.replica
    fig: dict = {"replica": victim, "mode": failure.mode, "step": failure.step, "pid": failure.pid,
                 "quorum_before": failure.quorum_before}
    after = [s for s in rec.samples if s.t >= failure.t]
    dropped = next((s for s in after if s.quorum_id and victim not in s.members), None)
    fig["detected"] = dropped is not None
    fig["time_to_detect_s"] = round(_quorum_time(dropped, rec.wall_offset) - failure.t, 4) if dropped else None
    fig["quorum_without"] = dropped.quorum_id if dropped else None
    fig["detect_reason"] = dropped.quorum_reason if dropped else ""
    back = next((s for s in after if dropped and s.t >= dropped.t and victim in s.members), None)
    fig["rejoined"] = back is not None
    fig["time_to_rejoin_quorum_s"] = round(_quorum_time(back, rec.wall_offset) - failure.t, 3) if back else None
    fig["quorum_rejoined"] = back.quorum_id if back else None
    # Recovered: its gradient is in a committed step again (admission happens at
    # an agreed step boundary, which may come a few steps after the new quorum).
    full = len(back.members) if back else 0
    trained = next((line for line in rec.steps[victim] if line.t > failure.t and line.contributors >= full), None)
    fig["time_to_recover_s"] = round(trained.t - failure.t, 3) if back and trained else None
    fig["first_step_trained_again"] = trained.step if back and trained else None
    fig["rejoin_reason"] = back.quorum_reason if back else ""
    restarts = [s.replicas[victim].restart_count for s in after if victim in s.replicas]
    fig["restart_count"] = max(restarts, default=0)
    fig["stacks_in"] = failure.stacks_in

    restart = next((s for s in rec.starts[victim] if s.t > failure.t), None)
    report = (restart.catch_up or {}) if restart else {}
    fig["restarted"] = restart is not None
    fig["catch_up_source"] = report.get("source", "")
    fig["snapshot_step"] = report.get("snapshot_step")
    fig["replayed_steps"] = report.get("replayed_steps")
    observed = max((s.replicas[victim].catch_up_bytes for s in after if victim in s.replicas), default=0)
    fig["catch_up_bytes"] = max(int(report.get("snapshot_bytes", 0)), observed)
    if report.get("began"):
        fig["catch_up_began_s"] = round(report["began"] - failure.t, 3)
        fig["snapshot_loaded_s"] = round(report["loaded"] - failure.t, 3) if report.get("loaded") else None
    fig["caught_up"] = bool(fig["time_to_recover_s"] is not None and rec.done.get(victim) is not None)

    survivors = [r for r in rec.replica_ids if r != victim]
    intervals, during = [], []
    for r in survivors:
        lines = rec.steps[r]
        for prev, line in pairwise(lines):
            intervals.append(line.t - prev.t)
            if trained and failure.t <= line.t and prev.t <= trained.t:
                during.append(line.t - prev.t)
    fig["median_step_s"] = round(statistics.median(intervals), 3) if intervals else None
    fig["survivors_longest_step_during_recovery_s"] = round(max(during), 3) if during else None
    gaps = sum(line.step - prev.step - 1 for r in survivors for prev, line in pairwise(rec.steps[r]))
    fig["survivor_steps_skipped"] = gaps
    return fig


HOW = {
    "kill": "killed (SIGKILL)",
    "hang": "hung (SIGSTOP, later SIGKILLed)",
    "deadlock": "deadlocked (its training loop blocked after the backward pass, process and heartbeats alive)",
    "kill-all": "killed (SIGKILL), every replica at once",
}


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def summary_text(s: dict, out_dir: str) -> str:
    """The summary printed at the end of the demo."""
    lines = ["", f"Summary (JSON: {out_dir}/summary.json, report: {out_dir}/demo.png, logs: {out_dir}/logs/)"]
    f = s["failure"]
    if f and f["mode"] == "kill-all":
        lines += _restore_text(f)
    elif f:
        how = HOW.get(f["mode"], f["mode"])
        if f["detected"]:
            taken = " as hung" if f["mode"] == "deadlock" else ""
            lines.append(f"  {f['replica']} was {how} after step {f['step']}; the coordinator took it out{taken}, "
                         f"forming quorum {f['quorum_without']} without it {f['time_to_detect_s'] * 1000:.0f} ms later "
                         f"({short_reason(f['detect_reason'])})")
        else:
            lines.append(f"  {f['replica']} was {how} after step {f['step']}; the coordinator never dropped it")
        if f["restarted"]:
            source = f"from {f['catch_up_source']} " if f["catch_up_source"] else ""
            snap = f" of step {f['snapshot_step']}" if f["snapshot_step"] is not None else ""
            replayed = f["replayed_steps"] or 0
            ended = ""
            if f["mode"] == "deadlock":
                ended = f"its agent ended the hung process (stacks dumped in {f['stacks_in']}) and restarted it" \
                    if f.get("stacks_in") else "its agent ended the hung process and restarted it"
            lines.append(f"  {ended or 'its agent restarted it'}; it caught up {source}({_mib(f['catch_up_bytes'])} "
                         f"snapshot{snap}, {replayed} step{'s' if replayed != 1 else ''} replayed)")
        if f["time_to_recover_s"] is not None:
            lines.append(f"  back in quorum {f['quorum_rejoined']} {f['time_to_rejoin_quorum_s']:.1f} s after the "
                         f"failure, training again from step {f['first_step_trained_again']}: time to recover "
                         f"{f['time_to_recover_s']:.1f} s")
        else:
            lines.append("  it did not train with the others again")
        if f["median_step_s"] is not None:
            longest = f["survivors_longest_step_during_recovery_s"]
            lines.append(f"  the survivors went on: {f['survivor_steps_skipped']} steps skipped; median step "
                         f"{f['median_step_s']:.2f} s"
                         + (f", longest during the recovery {longest:.2f} s" if longest else ""))
    finals = s["final_steps"]
    if s["all_reached_final_step"]:
        lines.append(f"  every replica reached step {s['steps']}")
    else:
        lines.append("  final steps: " + ", ".join(f"{r} {v if v is not None else '-'}" for r, v in finals.items()))
    lines.append(f"  effective training time: {100 * s['effective_training_time']:.1f}% of "
                 f"{s['replicas']} x {s['training_wall_s']:.1f} replica-seconds trained committed steps")
    if f and f["mode"] == "kill-all":
        redone = s.get("replica_steps_redone", 0)
        lines.append(f"  steps lost: {s['steps_lost']} of {s['replica_steps_total']} replica-steps never trained; "
                     f"{redone} replica-steps redone (committed after the checkpoint, lost with the state and "
                     "trained again: counted once, their first training as lost time)")
    else:
        lines.append(f"  steps lost: {s['steps_lost']} of {s['replica_steps_total']} replica-steps never trained "
                     "(batches the failed replica missed while out; no committed step was redone)")
    return "\n".join(lines)


def _restore_text(f: dict) -> list[str]:
    """kill-all: the kill, the restore, the quorum of every replica, training again."""
    who = ", ".join(f"{r} pid {pid}" for r, pid in f["pids"].items())
    lines = [f"  every replica's training process was SIGKILLed at once after step {f['step']} ({who})"]
    if not f["restored"]:
        lines.append("  the coordinator did not restore a checkpoint")
        return lines
    lost = f["committed_steps_lost"]
    which = f": {f['restored_step'] + 1}-{f['last_step_committed']}" if lost > 0 else ""
    by = "automatically" if f["requested_by"] in ("", "automatic") else f"as {f['requested_by']} asked"
    lines.append(f"  the coordinator restored the checkpoint of step {f['restored_step']} {by}, "
                 f"{f['time_to_restore_s']:.1f} s after the kill: {lost} committed step{'s' if lost != 1 else ''} "
                 f"lost{which}")
    if f["restarted"]:
        loaded = f["loaded_checkpoint"]
        how = [f"{', '.join(loaded)} loaded the checkpoint"] if loaded else []
        how += [f"{r} caught up from {src or 'a peer'}" for r, src in f["caught_up_from"].items()]
        lines.append(f"  their agents restarted them; {'; '.join(how)}")
    else:
        lines.append("  not every replica was restarted")
    if f["quorum_rejoined"] is not None:
        lines.append(f"  every replica in one quorum again {f['time_to_rejoin_quorum_s']:.1f} s after the kill "
                     f"(quorum {f['quorum_rejoined']}, at step {f['quorum_rejoined_step']})")
    if f["time_to_recover_s"] is not None:
        lines.append(f"  training again from step {f['first_step_trained_again']}: time to recover "
                     f"{f['time_to_recover_s']:.1f} s" + (f"; median step {f['median_step_s']:.2f} s"
                                                           if f["median_step_s"] is not None else ""))
    else:
        lines.append("  the replicas did not train together again")
    return lines
