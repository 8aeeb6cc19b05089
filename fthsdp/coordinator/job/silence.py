"""Silent replicas whose session still stands: a stopped process.

A process stopped by SIGSTOP (or one whose every thread is blocked) keeps
its connections open: its session stream does not close, only its
heartbeats stop. The coordinator notices the silence after the heartbeat
timeout, and a member is dropped from the quorum for it; but nothing on its
node would ever end the process, and a stopped joiner (not a member) would
not even be dropped from anything. So such a replica is given a notice
(``WatchEvent.hang``, ``Incarnation.notice``): its agent's HangWatch
(fthsdp/agent/node/hang_watch.py) ends it and restarts it, and it catches up.

Pure functions over the coordinator's replica entries, called by JobState.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fthsdp.coordinator.job.replica_entry import ReplicaEntry


def _may_notice(e: ReplicaEntry) -> bool:
    """Silent with its session open, and silence the only reason it is out."""
    inc = e.incarnation
    return (inc.session_id is not None and not inc.notice and inc.hung_at is None and inc.disconnected_at is None
            and inc.failed_at is None and not inc.restarted and inc.diverged_at is None
            and not e.standing.drain_requested and not e.standing.unreachable)


def dropped_members(replicas: Mapping[str, ReplicaEntry], previous: Iterable[str], kept: set[str],
                    quorum_id: int, timeout: float) -> dict[str, str]:
    """Members of the previous quorum that quorum ``quorum_id`` dropped for
    silence alone: {replica id: the notice}."""
    out = {}
    for rid in previous:
        e = replicas.get(rid)
        if rid not in kept and e is not None and _may_notice(e):
            out[rid] = f"taken out of quorum {quorum_id}: no heartbeat for {timeout:g}s (stopped?)"
    return out


def silent_outsiders(replicas: Mapping[str, ReplicaEntry], candidates: Iterable[str], members: Mapping[str, object],
                     timeout: float, now: float) -> dict[str, str]:
    """Replicas outside the quorum (catching up, or waiting to be admitted)
    that heartbeated once and have been silent past ``timeout`` as of
    ``now``: {replica id: the notice}."""
    out = {}
    for rid in candidates:
        e = replicas.get(rid)
        if rid in members or e is None or not e.incarnation.beating or not _may_notice(e):
            continue
        if e.view_heartbeat() + timeout <= now:
            out[rid] = f"no heartbeat for {timeout:g}s while outside the quorum{_doing(e)} (stopped?)"
    return out


def _doing(e: ReplicaEntry) -> str:
    if e.incarnation.catching_up:
        return f", catching up at step {e.incarnation.step}"
    return ""
