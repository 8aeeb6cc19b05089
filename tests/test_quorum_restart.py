"""The quorum decision right after a coordinator (re)start
(fthsdp/coordinator/decisions/quorum.py, rule 1 and the split-brain guard;
fthsdp/coordinator/decisions/liveness.py)."""

from __future__ import annotations

import pytest

from tests.harness.quorum_cases import GRACE, NOW, Case, alive, awaited, check, quorum, table

# After a coordinator (re)start (rule 1 and the split-brain guard): every
# replica loaded from the store has a grace to reconnect (GRACE: the
# heartbeat timeout 5 s + join_timeout 10 s); ``awaited(id, started)`` has not
# reconnected to a coordinator that started ``started`` seconds ago.
NOT_BACK = "not reconnected since the coordinator started"
RESTART_CASES = [
    Case("members not back yet are neither lost nor silent (no guard) while the grace runs",
         quorum("a", "b", "c"), table(alive("a"), awaited("b", 8), awaited("c", 8)), None, "quorum 7 unchanged"),
    Case("every other member back long since: the one missing is judged at once by its timeout from the start",
         quorum("a", "b", "c"), table(alive("a"), alive("b"), awaited("c", 6)), ("a", "b"), f"c ({NOT_BACK})"),
    Case("every other member back, its timeout from the start not run out: kept",
         quorum("a", "b", "c"), table(alive("a"), alive("b"), awaited("c", 3)), None, "quorum 7 unchanged"),
    Case("the others came back late: the one missing has a heartbeat timeout from the latest registration",
         quorum("a", "b", "c"), table(alive("a"), alive("b", registered_at=NOW - 4.9), awaited("c", 12)),
         None, "quorum 7 unchanged"),
    Case("... and is judged once that ran out",
         quorum("a", "b", "c"), table(alive("a"), alive("b", registered_at=NOW - 5.0), awaited("c", 12)),
         ("a", "b"), f"c ({NOT_BACK})"),
    Case("a member lost after it reconnected is dropped at once; the one still missing keeps its place",
         quorum("a", "b", "c"), table(alive("a"), awaited("b", 2), alive("c", disconnected_at=NOW - 0.01)),
         ("a", "b"), "c (stream closed)"),
    Case("a member that came back restarted leaves at once; the one still missing keeps its place",
         quorum("a", "b", "c"),
         table(alive("a"), awaited("b", 2), alive("c", step=0, restarted=True, registered_at=NOW - 0.1)),
         ("a", "b"), "c (restarted)", catch_up={"c": "a"}),
    Case("another member failed after it reconnected: the last one missing is judged",
         quorum("a", "b", "c"), table(alive("a"), alive("b", failed_at=NOW - 0.5), awaited("c", 6)),
         ("a",), f"b (reported failed), c ({NOT_BACK})"),
    Case("another member failed before it reconnected: the one missing keeps its grace",
         quorum("a", "b", "c"), table(alive("a"), awaited("b", 6, failed_at=NOW - 0.5), awaited("c", 6)),
         ("a", "c"), "b (reported failed)"),
    Case("... also once that one is out of the quorum, until its restart registers",
         quorum("a", "c"), table(alive("a"), awaited("b", 6, failed_at=NOW - 0.5), awaited("c", 6)),
         None, "quorum 7 unchanged"),
    Case("... and then for a heartbeat timeout more",
         quorum("a", "c"), table(alive("a"), alive("b", step=0, registered_at=NOW - 0.5), awaited("c", 6)),
         None, "quorum 7 unchanged", catch_up={"b": "a"}),
    Case("two missing: neither is judged before the grace ends",
         quorum("a", "b", "c", "d", "e"),
         table(alive("a"), alive("b"), alive("c"), awaited("d", GRACE - 0.1), awaited("e", GRACE - 0.1)),
         None, "quorum 7 unchanged"),
    Case("the grace over: every one missing is judged, and the guard's wait counted from their timeout is over",
         quorum("a", "b", "c"), table(alive("a"), awaited("b", GRACE), awaited("c", GRACE)),
         ("a",), f"b ({NOT_BACK}), c ({NOT_BACK})"),
    Case("a grace shorter than the guard's wait: the guard holds for a majority missing at its end",
         quorum("a", "b", "c"), table(alive("a"), awaited("b", 8, grace=7), awaited("c", 8, grace=7)),
         None, "split-brain guard: 2 of 3 members went silent"),
    Case("no member missing: a record of a non-member is judged by its timeout from the start",
         quorum("a", "b"), table(alive("a"), alive("b"), awaited("j", 6)), None, "[2 alive; 1 lost"),
    Case("a non-member's record is not judged while a member is still missing",
         quorum("a", "b", "c"), table(alive("a"), awaited("b", 6), awaited("c", 6), awaited("j", 6)), None,
         "[4 alive; 0 lost"),
    Case("no joiner is admitted while a member is not back: its step is not known",
         quorum("a", "b"), table(alive("a", step=0), awaited("b", 2, step=0), alive("j", 0, registered_at=NOW - 1)),
         None, "quorum 7 unchanged"),
    # Thousands of hosts coming back to a new leader take longer than any fixed
    # grace: while those found in the store keep returning, the graces last.
    Case("the grace over, but a stored replica came back within a heartbeat timeout: still awaited",
         quorum("a", "b", "c", "d"),
         table(alive("a"), alive("b", registered_at=NOW - 4.9, returned=True), awaited("c", GRACE + 30),
               awaited("d", GRACE + 30)),
         None, "quorum 7 unchanged"),
    Case("... and judged a heartbeat timeout after the last return",
         quorum("a", "b", "c", "d"),
         table(alive("a"), alive("b", registered_at=NOW - 5.0, returned=True), awaited("c", GRACE + 30),
               awaited("d", GRACE + 30)),
         ("a", "b"), f"c ({NOT_BACK}), d ({NOT_BACK})"),
    Case("a replica that joined fresh, not one found in the store, extends no grace",
         quorum("a", "b", "c", "d"),
         table(alive("a"), alive("b", registered_at=NOW - 4.9), awaited("c", GRACE + 30),
               awaited("d", GRACE + 30), alive("j", 0, registered_at=NOW - 0.1)),
         ("a", "b"), f"c ({NOT_BACK}), d ({NOT_BACK})", catch_up={"j": "a"}),
    Case("members coming back keep their place, the same quorum (fast path)",
         quorum("a", "b"), table(alive("a"), alive("b", registered_at=NOW - 0.2)), None, "quorum 7 unchanged"),
]


@pytest.mark.parametrize("case", RESTART_CASES, ids=[c.name for c in RESTART_CASES])
def test_decide_after_a_coordinator_start(case: Case) -> None:
    check(case)
