"""Silent replicas whose session still stands (fthsdp/coordinator/job/silence.py)."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.coordinator.decisions.quorum_types import Quorum
from fthsdp.coordinator.job import silence
from fthsdp.coordinator.job.replica_entry import Incarnation, ReplicaEntry, Standing
from tests.harness.jobs import joined_job

TIMEOUT = 5.0


STANDING = {f.name for f in dataclasses.fields(Standing)}


def entry(replica_id: str = "j", **kw) -> ReplicaEntry:
    fields = {**dict(session_id="s", beating=True, last_heartbeat=0.0, catching_up=True, step=40), **kw}
    return ReplicaEntry(replica_id, Incarnation(**{k: v for k, v in fields.items() if k not in STANDING}),
                        Standing(**{k: v for k, v in fields.items() if k in STANDING}))


@pytest.mark.parametrize(
    "changes, member, now, noticed",
    [
        ({}, False, 5.0, True),  # silent for the timeout, session open: stopped
        ({}, False, 4.9, False),  # not yet
        ({"last_heartbeat": 2.0}, False, 5.0, False),  # it beat again meanwhile
        ({}, True, 5.0, False),  # a member: the quorum's own drop gives it its notice
        ({"session_id": None}, False, 9.0, False),  # not registered any more
        ({"beating": False}, False, 9.0, False),  # never heartbeated: not started, not stopped
        ({"disconnected_at": 1.0}, False, 9.0, False),  # its stream closed: it is gone, not stopped
        ({"failed_at": 1.0}, False, 9.0, False),  # its agent reported it
        ({"restarted": True}, False, 9.0, False),
        ({"drain_requested": True}, False, 9.0, False),
        ({"notice": "earlier"}, False, 9.0, False),  # told once
        ({"rank_heartbeats": {1: 0.5}, "last_heartbeat": 8.0}, False, 5.5, True),  # its most silent rank counts
    ],
)
def test_silent_outsiders(changes, member, now, noticed):
    e = entry(**changes)
    got = silence.silent_outsiders({"j": e}, ["j"], {"j": object()} if member else {}, TIMEOUT, now)
    assert bool(got) == noticed
    if noticed:
        assert "catching up at step 40" in got["j"] and "stopped?" in got["j"]


def test_dropped_members_only_for_silence():
    replicas = {"a": entry(replica_id="a"), "b": entry(replica_id="b", failed_at=1.0), "c": entry(replica_id="c")}
    got = silence.dropped_members(replicas, ["a", "b", "c"], {"c"}, 7, TIMEOUT)
    assert set(got) == {"a"} and got["a"].startswith("taken out of quorum 7")


def test_a_stopped_joiner_is_told_once_through_its_watch_stream():
    job, s = joined_job(2)
    sid = job.register("j", "h:9", 1, 0, 0, 1.0, restart_count=4)
    job.heartbeat("j", sid, 5, True, "", 0, 1.5)  # heartbeats while it catches up, then stops
    job.replicas["j"].incarnation.catching_up = True
    for t in (2.0, 4.0, 6.0, 6.6, 6.7):
        for rid in ("r0", "r1"):
            job.heartbeat(rid, s[rid], 3, False, "", 0, t)
        if t == 6.6:
            job.evaluate(6.55)  # a decision after its timeout ran out (at 6.5), before the scan: it still counts
        job.needs_decision(t)
        noticed = job.notice_silent_outsiders(t)
        assert bool(noticed) == (t == 6.6), t  # 1.5 + 5 s, then once only
    event = job.watch_event("j", "leader")
    assert event.hang.restart_count == 4 and "outside the quorum" in event.hang.reason
    job.needs_decision(7.0)
    assert not job.notice_silent_outsiders(7.0)  # once
    assert not job.watch_event("r0", "leader").HasField("hang")
    decision = job.evaluate(7.0)
    if decision.members is not None:
        job.apply(decision, Quorum(2, decision.members), 2)
    assert job.watch_event("j", "leader").HasField("hang")


def test_a_replica_registered_after_a_scan_that_found_none_still_times_out():
    """The heartbeat-timeout scan runs only once the earliest expiry it saw
    is reached; a scan of no replicas saw none, so a registration must bring
    the next scan forward, or a member's silence would go unseen."""
    from fthsdp.coordinator.decisions.quorum_types import Rules
    from fthsdp.coordinator.job.state import JobState
    from tests.harness.jobs import HANG_RULES

    job = JobState("j", Rules(min_replicas=1, heartbeat_timeout=5.0), HANG_RULES)
    job.needs_decision(0.0)  # the first tick: no replica yet
    job.evaluate(0.0)
    sid = job.register("r0", "h:0", 1, 0, 0, 1.0)
    job.heartbeat("r0", sid, 0, False, "", 0, 1.1)
    decision = job.evaluate(1.2)
    job.apply(decision, Quorum(1, decision.members), 1)
    job.evaluate(1.3)  # settled
    for t in (2.0, 5.0, 6.0):
        job.heartbeat("r0", sid, 1, False, "", 0, t - 0.5) if t < 6.0 else None
        assert not job.needs_decision(t)
    assert job.needs_decision(9.6)  # last heard at 4.5: its 5 s ran out at 9.5
