"""What `fthsdp status` and the status page show of the coordinator's hang
and straggler detection (fthsdp/coordinator/decisions/hang.py): the job's hang limit and
median step time, each replica's phase, step time and straggler score, and
why a replica was taken out. fthsdp/coordinator/decisions/status_view.py renders the rest of
a status."""

from __future__ import annotations

from fthsdp.protos.v1 import coordinator_pb2 as pb

PHASE_WORDS = {
    "PHASE_COMPUTE": "computing",
    "PHASE_ALLREDUCE": "all-reduce",
    "PHASE_UPDATE": "update",
    "PHASE_SECTION": "section",
    "PHASE_STARTING": "starting",
}


def phase_word(phase: int) -> str | None:
    """The short word for a reported phase; None for none reported (an older
    replica) or one newer than this client knows."""
    return PHASE_WORDS.get(pb.Phase.Name(phase)) if phase in pb.Phase.values() else None


def replica_progress(r) -> dict:
    """What rank 0 of a replica (a ``ReplicaStatus``) last reported of its
    step and how it compares; None where nothing is known, as status_dict
    does for the catch-up fields."""
    phase = phase_word(r.phase)
    return {
        "phase": phase,
        "phase_age_s": r.phase_age_s if phase else None,
        "step_time_s": r.step_time_s or None,
        "compute_time_s": r.compute_time_s or None,
        "straggler_score": r.straggler_score or None,
        "hang_reason": r.hang_reason or None,
    }


def progress_view(status, view: dict) -> dict:
    """``view`` (status_view.status_dict of ``status``) with the job's hang
    limit and median step time and every replica's progress; a follower
    knows none of them (None)."""
    view["hang_limit_s"] = status.hang_limit_s or None
    view["median_step_time_s"] = status.median_step_time_s or None
    by_id = {r.replica_id: r for r in status.replicas}
    for replica in view["replicas"]:
        replica.update(replica_progress(by_id[replica["id"]]))
    return view


def _seconds(value: float | None, digits: int = 2) -> str:
    """Seconds, with hundredths while they matter (step times of a fraction of a second)."""
    if value is None:
        return "-"
    return f"{value:.{digits if value < 10 else 1}f}s"


def progress_lines(view: dict) -> list[str]:
    """The lines `fthsdp status` prints below the replica table: the hang
    limit, each replica's phase, step time and straggler score, and why any
    was taken out. The reasons are sentences, hence lines of their own
    rather than a column that would widen every row."""
    if view["hang_limit_s"] is None:
        return []  # a follower's answer: the leader knows
    median = view["median_step_time_s"]
    lines = ["", f"hang limit {_seconds(view['hang_limit_s'], 1)}   median step time "
             + (_seconds(median) if median else "- (none reported yet)")]
    replicas = view["replicas"]
    if not any(r["phase"] or r["step_time_s"] or r["straggler_score"] or r["hang_reason"] for r in replicas):
        return lines  # replicas that report no progress (older ones): a table of dashes says nothing
    rows = [("REPLICA", "PHASE", "IN PHASE", "STEP TIME", "STRAGGLER")]
    for r in replicas:
        score = f"{r['straggler_score']:.1f}x" if r["straggler_score"] else "-"
        rows.append((r["id"], r["phase"] or "-", _seconds(r["phase_age_s"], 1), _seconds(r["step_time_s"]), score))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines += [f"{r['id']} taken out: {r['hang_reason']}" for r in replicas if r["hang_reason"]]
    return lines
