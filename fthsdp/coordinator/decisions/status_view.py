"""Render a StatusResponse as a table or as JSON (the `fthsdp status` output)."""

from __future__ import annotations

import json

from fthsdp.core.faults import FAULT_NAMES, fault_text
from fthsdp.protos.v1 import coordinator_pb2 as pb

STATE_NAMES = {
    pb.REPLICA_STATE_UNSPECIFIED: "unknown",
    pb.REPLICA_STATE_JOINING: "joining",
    pb.REPLICA_STATE_HEALTHY: "healthy",
    pb.REPLICA_STATE_CATCHING_UP: "catching-up",
    pb.REPLICA_STATE_FAILED: "failed",
    pb.REPLICA_STATE_DRAINING: "draining",
}


AGENT_STATE_NAMES = {
    value: name.removeprefix("AGENT_STATE_").lower().replace("_", "-")
    for name, value in pb.AgentState.items()
    if value != pb.AGENT_STATE_UNSPECIFIED
}


def give_up_hint(job: str, step: int) -> str:
    """The command that starts a job over, as status and the log suggest it."""
    return f"`fthsdp give-up-state --job {job} --step {step}` starts over"


def state_lost_line(job: str, step: int, remains: str) -> str:
    return f"STATE LOST at step {step}: {remains} (waiting; {give_up_hint(job, step)})"


def reopen_hint(job: str, step: int) -> str:
    """The command that reopens a finished job, as status, the log and the replicas say it."""
    return f"`fthsdp reopen-job --job {job} --step {step}` reopens it"


def finished_reason(job: str, step: int) -> str:
    """Why no quorum forms while the job is finished (the decision's reason)."""
    return (f"job {job} finished at step {step}: every member of its last quorum left finished; "
            f"no quorum forms until an operator reopens it ({reopen_hint(job, step)}).")


def finished_line(job: str, step: int) -> str:
    return f"FINISHED at step {step}: every member left finished (no quorum forms; {reopen_hint(job, step)})"


def _finished_dict(status: pb.StatusResponse) -> dict | None:
    if not status.HasField("finished"):
        return None
    f = status.finished
    return {"step": f.step, "time": f.unix_ms / 1000, "quorum_id": f.quorum_id}


def _give_up_dict(status: pb.StatusResponse) -> dict | None:
    if not status.HasField("last_give_up"):
        return None
    g = status.last_give_up
    return {"step": g.step, "time": g.unix_ms / 1000, "requested_by": g.requested_by, "peer": g.peer,
            "coordinator": g.coordinator, "quorum_id": g.quorum_id}


def _checkpoint_dict(c: pb.CheckpointRecord) -> dict:
    return {"step": c.step, "path": c.path, "digest": c.digest, "time": c.sealed_unix_ms / 1000,
            "shares": c.shares, "bytes": c.bytes, "sealed_by": c.sealed_by, "quorum_id": c.quorum_id}


def _restore_dict(status: pb.StatusResponse) -> dict | None:
    if not status.HasField("last_restore"):
        return None
    r = status.last_restore
    return {"step": r.checkpoint.step, "path": r.checkpoint.path, "lost_step": r.lost_step,
            "steps_lost": r.lost_step - r.checkpoint.step, "time": r.unix_ms / 1000,
            "requested_by": r.requested_by}


def checkpoint_line(d: dict, now: float) -> str:
    """``checkpoint: step 1200, 4.2 min old, /ckpt/job/step-0000001200``"""
    c = d["checkpoint"]
    if c is None:
        return "checkpoint: none"
    age = max(0.0, now - c["time"])
    shown = f"{age:.0f}s" if age < 120 else f"{age / 60:.1f} min" if age < 7200 else f"{age / 3600:.1f} h"
    return f"checkpoint: step {c['step']}, {shown} old, {c['path']}"


def restore_line(d: dict) -> str:
    r = d["last_restore"]
    return (f"restored from step {r['step']}; {r['steps_lost']} committed steps lost "
            f"(state lost at step {r['lost_step']})")


def injection_dict(i: pb.FaultInjection) -> dict:
    """One injected fault as status JSON shows it."""
    slow = i.kind == pb.FAULT_KIND_SLOW
    return {"id": i.id, "replica": i.replica_id, "fault": FAULT_NAMES.get(i.kind, "unknown"),
            "seconds": i.seconds if slow else None, "steps": i.steps if slow else None,
            "restart_count": i.restart_count, "step": i.step, "time": i.unix_ms / 1000,
            "requested_by": i.requested_by, "peer": i.peer}


def injection_line(i: dict) -> str:
    """``replica r1: fault injected: hang (asked by alice@host) at step 12``, as the coordinator logs it."""
    who = i["requested_by"] or "an unnamed operator"
    return (f"replica {i['replica']}: fault injected: {fault_text(i['fault'], i['seconds'], i['steps'])} "
            f"(asked by {who}) at step {i['step']}")


def status_dict(status: pb.StatusResponse) -> dict:
    """The documented JSON shape; extra keys may be added, none removed."""
    has_quorum = status.HasField("quorum")
    return {
        "job": status.job,
        "leader": status.leader,
        "epoch": status.epoch,
        "committed_step": status.committed_step,
        "state_lost_step": status.state_lost_step,
        "state_lost_reason": status.state_lost_reason,
        "last_give_up": _give_up_dict(status),
        "checkpoint": _checkpoint_dict(status.checkpoint) if status.HasField("checkpoint") else None,
        "last_restore": _restore_dict(status),
        "finished": _finished_dict(status),
        "quorum": {
            "id": status.quorum.id if has_quorum else 0,
            "members": [m.replica_id for m in status.quorum.members] if has_quorum else [],
            "step": status.quorum.step if has_quorum else 0,
            "reason": status.quorum.reason if has_quorum else "",
        },
        "reason": status.reason,
        "injections": [injection_dict(i) for i in status.injections],
        "groups": [
            {
                "replica_id": g.replica_id,
                "round": g.round,
                "complete": g.complete,
                "nnodes": g.nnodes,
                "reason": g.reason,
                "hosts": [{"host_id": h.host_id, "node_rank": h.node_rank if h.node_rank >= 0 else None,
                           "state": h.state, "lost_for_s": h.lost_for_s if h.state == "lost" else None}
                          for h in g.hosts],
            }
            for g in status.groups
        ],
        "spares": list(status.spares),
        "replicas": [
            {
                "id": r.replica_id,
                "state": STATE_NAMES.get(r.state, "unknown"),
                "step": r.step,
                "heartbeat_age_s": r.heartbeat_age_s if r.heartbeat_age_s >= 0 else None,
                "address": r.address,
                "state_checksum": r.state_checksum or None,
                "checksum_step": r.checksum_step if r.state_checksum else None,
                "world_size": r.world_size,
                "cordoned": r.cordoned,
                "catch_up_source": r.catch_up_source or None,
                "catch_up_bytes": r.catch_up_bytes if r.catch_up_total_bytes else None,
                "catch_up_total_bytes": r.catch_up_total_bytes or None,
                "agent_state": AGENT_STATE_NAMES.get(r.agent_state),
                "restart_count": r.restart_count,
                "checksum_mismatch_step": r.checksum_mismatch_step or None,
                "mismatch_reason": r.mismatch_reason or None,
                "mismatch_strikes": r.mismatch_strikes,
                "agent_detail": r.agent_detail or None,
                "unreachable": r.unreachable or None,
            }
            for r in status.replicas
        ],
    }


def status_json(status: pb.StatusResponse) -> str:
    return json.dumps(status_dict(status), indent=2)


def status_table(status: pb.StatusResponse, now: float = 0.0) -> str:
    """``now``: unix seconds, for the checkpoint's age (0: the checkpoint line is left out)."""
    d = status_dict(status)
    q = d["quorum"]
    lines = [
        f"job {d['job']}   leader {d['leader']} (epoch {d['epoch']})   committed step {d['committed_step']}",
        *([state_lost_line(d["job"], d["state_lost_step"], d["state_lost_reason"])] if d["state_lost_step"] else []),
        *([finished_line(d["job"], d["finished"]["step"])] if d["finished"] else []),
        *([checkpoint_line(d, now)] if now and d["checkpoint"] else []),
        *([restore_line(d)] if d["last_restore"] else []),
        f"quorum {q['id'] or '-'}: {', '.join(q['members']) or 'none'}" + (f" at step {q['step']}" if q["id"] else ""),
        f"decision: {d['reason']}",
        "",
    ]
    header = ("REPLICA", "STATE", "STEP", "HEARTBEAT", "ADDRESS", "RANKS", "CHECKSUM", "NOTE")
    rows = [header]
    for r in d["replicas"]:
        age = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f}s ago"
        checksum = f"{r['state_checksum'][:12]}@{r['checksum_step']}" if r["state_checksum"] else "-"
        notes = []
        if r["cordoned"]:
            notes.append("cordoned")
        if r["checksum_mismatch_step"]:
            notes.append(f"CHECKSUM MISMATCH at step {r['checksum_mismatch_step']}")
        if r["catch_up_source"]:
            progress = ""
            if r["catch_up_total_bytes"]:
                done, total = r["catch_up_bytes"], r["catch_up_total_bytes"]
                progress = f", {done / 2**20:.0f}/{total / 2**20:.0f} MiB ({100 * done // total}%)"
            notes.append(f"from {r['catch_up_source']}{progress}")
        if r["agent_state"]:
            notes.append(f"agent {r['agent_state']}"
                         + (f", {r['restart_count']} restarts" if r["restart_count"] else ""))
        rows.append((r["id"], r["state"], str(r["step"]), age, r["address"], str(r["world_size"]), checksum,
                     ", ".join(notes)))
    if len(rows) == 1:
        lines.append("no replicas registered")
        return "\n".join(lines + group_lines(d["groups"], d["spares"]) + injection_lines(d["injections"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    lines += verdict_lines(d["replicas"])
    lines += group_lines(d["groups"], d["spares"])
    lines += injection_lines(d["injections"])
    return "\n".join(lines)


def host_cell(h: dict) -> str:
    rank = f"node rank {h['node_rank']} " if h["node_rank"] is not None else ""
    lost = f" {h['lost_for_s']:.0f}s ago" if h["state"] == "lost" else ""
    return f"{rank}{h['host_id']} ({h['state']}{lost})"


def group_lines(groups: list[dict], spares: list[str]) -> list[str]:
    """The groups of several hosts: a line each with its round and hosts, and why it waits."""
    if not groups and not spares:
        return []
    lines = ["", "replica groups of several hosts:"]
    for g in groups:
        state = "running" if g["complete"] else "gathering"
        lines.append(f"  {g['replica_id']}: round {g['round']} {state}: "
                     + ", ".join(host_cell(h) for h in g["hosts"]))
        if not g["complete"] and g["reason"]:
            lines.append(f"    {g['reason']}")
    lines.append(f"  spares waiting: {', '.join(spares) if spares else 'none'}")
    return lines


INJECTIONS_SHOWN = 5
"""The newest injected faults listed below the table (JSON has every one kept)."""


def injection_lines(injections: list[dict]) -> list[str]:
    if not injections:
        return []
    shown = injections[-INJECTIONS_SHOWN:]
    more = f" (newest {len(shown)} of {len(injections)})" if len(injections) > len(shown) else ""
    return ["", f"injected faults{more}:", *(f"  {injection_line(i)}" for i in shown)]


def verdict_lines(replicas: list[dict]) -> list[str]:
    """Below the replica table, a line each (sentences, not a column that
    would widen every row): why a replica's state disagreed with the
    members', and an agent that gave up and why."""
    lines = []
    for r in replicas:
        if r["mismatch_reason"]:
            strikes = r["mismatch_strikes"]
            count = f" ({strikes} in a row after catching up)" if strikes else ""
            lines.append(f"{r['id']} checksum mismatch{count}: {r['mismatch_reason']}")
        if r.get("unreachable"):
            lines.append(f"{r['id']} kept out, waiting: {r['unreachable']}")
        if r["agent_state"] == "gave-up" and r["agent_detail"]:
            lines.append(f"{r['id']} GAVE UP (its agent does not restart it): {r['agent_detail']}")
    return [""] + lines if lines else []
