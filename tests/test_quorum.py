"""The quorum decision, table-driven with an injected clock (no sleeps, no I/O)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.quorum import (
    Member, Quorum, ReplicaView, Rules, decide, holds_state, lost_at, next_last_drop_id, settle_for,
)

NOW = 1000.0
RULES = Rules(min_replicas=1, heartbeat_timeout=5.0, join_timeout=10.0)


def alive(rid: str, step: int = 100, **kw) -> ReplicaView:
    fields = {"last_heartbeat": NOW - 1, "registered_at": NOW - 60, **kw}
    return ReplicaView(rid, address=f"{rid}:1", step=step, **fields)


def silent(rid: str, since: float = 1.0, **kw) -> ReplicaView:
    """Heartbeats stopped; the timeout ran out ``since`` seconds ago."""
    return dataclasses.replace(alive(rid, **kw), last_heartbeat=NOW - RULES.heartbeat_timeout - since)


def quorum(*ids: str, qid: int = 7) -> Quorum:
    return Quorum(qid, tuple(Member(i, f"{i}:1", 1, 100, 3) for i in ids), step=100)


def table(*views: ReplicaView) -> dict[str, ReplicaView]:
    return {v.replica_id: v for v in views}


@dataclasses.dataclass
class Case:
    name: str
    prev: Quorum | None
    replicas: dict[str, ReplicaView]
    expect: tuple[str, ...] | None
    reason: str
    rules: Rules = RULES
    now: float = NOW
    catch_up: dict[str, str] = dataclasses.field(default_factory=dict)
    prev_catch_up: dict[str, str] = dataclasses.field(default_factory=dict)
    committed: int = 0
    """The job's committed step, an input of the decision (rule 8)."""
    lost: int = 0
    """The state_lost_step expected."""
    ended: bool = False
    """Whether the members ended the state on purpose."""


CASES = [
    Case("first quorum of a new job", None, table(alive("a", 0), alive("b", 0), alive("c", 0)), ("a", "b", "c"), "admitting a, b, c"),
    Case("first quorum waits for min_replicas", None, table(alive("a", 0)), None, "need min_replicas 2", rules=dataclasses.replace(RULES, min_replicas=2)),
    Case(
        "first quorum needs a majority of the live replicas up to date",
        None,
        table(alive("a", 100), alive("b", 50), alive("c", 50), alive("d", 50)),
        None,
        "split-brain guard: only 1 of 4",
        catch_up={"b": "a", "c": "a", "d": "a"},
    ),
    Case("fast path: every member healthy", quorum("a", "b", "c"), table(alive("a"), alive("b"), alive("c")), None, "quorum 7 unchanged"),
    Case("member silent past the heartbeat timeout", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")), ("a", "b"), "c (heartbeat timeout)"),
    Case(
        "member whose watch stream closed",
        quorum("a", "b", "c"),
        table(alive("a"), alive("b"), alive("c", disconnected_at=NOW - 0.01)),
        ("a", "b"),
        "c (stream closed)",
    ),
    Case(
        "closed stream ignored when disconnect_is_failure is off",
        quorum("a", "b", "c"),
        table(alive("a"), alive("b"), alive("c", disconnected_at=NOW - 0.01)),
        None,
        "unchanged",
        rules=dataclasses.replace(RULES, disconnect_is_failure=False),
    ),
    Case("half of two members silent: shrink at once", quorum("a", "b"), table(alive("a"), silent("b")), ("a",), "b (heartbeat timeout)"),
    Case(
        "majority silent at once: split-brain guard waits",
        quorum("a", "b", "c"),
        table(alive("a"), silent("b"), silent("c")),
        None,
        "split-brain guard: 2 of 3 members went silent",
    ),
    Case(
        "majority silent longer than join_timeout: shrink",
        quorum("a", "b", "c"),
        table(alive("a"), silent("b", since=11), silent("c", since=12)),
        ("a",),
        "b (heartbeat timeout), c (heartbeat timeout)",
    ),
    Case(
        "majority reported failed: no guard",
        quorum("a", "b", "c"),
        table(alive("a"), alive("b", failed_at=NOW - 0.1), alive("c", failed_at=NOW - 0.1)),
        ("a",),
        "b (reported failed), c (reported failed)",
    ),
    Case(
        "member restarted as a new incarnation: leaves and catches up",
        quorum("a", "b", "c"),
        table(alive("a"), alive("b"), alive("c", step=0, restarted=True, registered_at=NOW - 0.1)),
        ("a", "b"),
        "c (restarted)",
        catch_up={"c": "a"},
    ),
    Case("draining member leaves", quorum("a", "b", "c"), table(alive("a"), alive("b"), alive("c", drain_requested=True)), ("a", "b"), "c (draining)"),
    Case("member that left is forgotten", quorum("a", "b", "c"), table(alive("a"), alive("b")), ("a", "b"), "c (left)"),
    Case(
        "shrink below min_replicas: no quorum",
        quorum("a", "b"),
        table(alive("a"), silent("b")),
        None,
        "need min_replicas 2",
        rules=dataclasses.replace(RULES, min_replicas=2),
    ),
    Case("joiner behind: assigned a source, not admitted", quorum("a", "b"), table(alive("a"), alive("b"), alive("d", 0)), None, "unchanged", catch_up={"d": "a"}),
    Case(
        "joiner level with the head by its replay: not admitted before it says ready, and keeps its source",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("d", 100, catching_up=True)),
        None,
        "unchanged",
        catch_up={"d": "b"},
        prev_catch_up={"d": "b"},
    ),
    Case(
        "joiner ready: admitted at once when nobody else is pending",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("d", 97, ready_since=NOW - 0.1)),
        ("a", "b", "d"),
        "admitting d",
    ),
    Case(
        "joiner ready waits for another catching up",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("d", 97, ready_since=NOW - 1), alive("e", 3)),
        None,
        "waiting up to join_timeout 10s for 1 catching-up",
        catch_up={"d": "a", "e": "b"},
    ),
    Case(
        "joiner ready admitted after join_timeout",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("d", 97, ready_since=NOW - 10), alive("e", 3)),
        ("a", "b", "d"),
        "admitting d after join_timeout",
        catch_up={"e": "a"},
    ),
    Case(
        "cordoned joiner is not admitted, cordoned member stays",
        quorum("a", "b"),
        table(alive("a", cordoned=True), alive("b"), alive("d", 100, cordoned=True)),
        None,
        "unchanged",
    ),
    Case(
        "sources spread over the members",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("x", 0), alive("y", 0), alive("z", 0)),
        None,
        "unchanged",
        catch_up={"x": "a", "y": "b", "z": "a"},
    ),
    Case(
        "a member whose last heartbeat lags a step is a source too",
        quorum("a", "b"),
        table(alive("a", 101), alive("b", 100), alive("x", 0), alive("y", 0)),
        None,
        "unchanged",
        catch_up={"x": "a", "y": "b"},
    ),
    Case(
        "sources are sticky",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("x", 0), alive("y", 0)),
        None,
        "unchanged",
        catch_up={"x": "b", "y": "a"},
        prev_catch_up={"x": "b"},
    ),
    Case(
        "a source that leaves is replaced",
        quorum("a", "b"),
        table(alive("a"), silent("b"), alive("x", 0)),
        ("a",),
        "b (heartbeat timeout)",
        catch_up={"x": "a"},
        prev_catch_up={"x": "b"},
    ),
    Case(
        "every member lost, restarted replicas form a new quorum",
        quorum("a", "b"),
        table(alive("a", 90, restarted=True), alive("b", 80, restarted=True)),
        ("a",),
        "a (restarted), b (restarted); admitting a",
        catch_up={"b": "a"},
    ),
    Case(
        "a burst of arrivals settles before the first quorum",
        None,
        table(alive("a", 0, registered_at=NOW - 2), alive("b", 0, registered_at=NOW - 0.05)),
        None,
        "waiting for arrivals to settle (join_settle 0.2s) before admitting a, b",
        rules=dataclasses.replace(RULES, join_settle=0.2),
    ),
    Case(
        "arrivals settled: all admitted in one change",
        None,
        table(alive("a", 0, registered_at=NOW - 2), alive("b", 0, registered_at=NOW - 0.2)),
        ("a", "b"),
        "admitting a, b",
        rules=dataclasses.replace(RULES, join_settle=0.2),
    ),
    Case(
        "a steady trickle of arrivals is admitted after join_timeout all the same",
        None,
        table(alive("a", 0, registered_at=NOW - 10), alive("b", 0, registered_at=NOW - 0.01)),
        ("a", "b"),
        "admitting a, b",
        rules=dataclasses.replace(RULES, join_settle=0.2),
    ),
    Case(
        "a ready joiner waits for the settle time",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("x", 100, ready_since=NOW - 0.1)),
        None,
        "waiting for arrivals to settle",
        rules=dataclasses.replace(RULES, join_settle=0.2),
    ),
    Case(
        "a shrink does not wait for the settle time, and takes the ready joiner along",
        quorum("a", "b"),
        table(alive("a"), silent("b"), alive("x", 100, ready_since=NOW - 0.1)),
        ("a", "x"),
        "b (heartbeat timeout); admitting x",
        rules=dataclasses.replace(RULES, join_settle=0.2),
    ),
    Case(
        "a replica not heard from since it registered is not admitted",
        quorum("a"),
        table(alive("a"), alive("b"), alive("c", beating=False)),
        ("a", "b"),
        "1 registered, no heartbeat yet",
    ),
    Case(
        "a member that registered again after a failover keeps its place before its first heartbeat",
        quorum("a", "b"),
        table(alive("a"), alive("b", beating=False)),
        None,
        "quorum 7 unchanged",
    ),
    Case(
        "arrival counts from the first heartbeat, not the registration",
        quorum("a"),
        table(alive("a"), alive("b", first_heartbeat=NOW - 0.1)),
        None,
        "waiting for arrivals to settle (join_settle 0.5s) before admitting b",
        rules=dataclasses.replace(RULES, join_settle=0.5),
    ),
    # ----- rule 8: the committed state (the members held step 100) --------------------
    Case(
        "every member lost, fresh replicas at step 0: state lost, nobody admitted, nobody a source",
        quorum("a", "b"),
        table(alive("a", 0, restarted=True), alive("b", 0, restarted=True), alive("c", 0)),
        None,
        "state lost at step 100: no live replica holds it; a at step 0, b at step 0, c at step 0.",
        committed=100,
        lost=100,
    ),
    Case(
        "every member killed and nothing back: state lost once the split-brain guard is past",
        quorum("a", "b"),
        table(alive("a", disconnected_at=NOW - 11), alive("b", disconnected_at=NOW - 11)),
        None,
        "state lost at step 100: no live replica holds it; no replica is alive.",
        committed=100,
        lost=100,
    ),
    Case(
        "every member silent a moment ago: the split-brain guard waits, the state is not lost yet",
        quorum("a", "b"),
        table(silent("a"), silent("b"), alive("c", 0)),
        None,
        "split-brain guard: 2 of 2 members went silent",
        committed=100,
    ),
    Case(
        "a holder alone forms the quorum; the replicas that lost the state catch up from it",
        quorum("a", "b"),
        table(alive("a", 0, restarted=True), alive("b", 0, restarted=True), alive("c", 100)),
        ("c",),
        "a (restarted), b (restarted); admitting c",
        catch_up={"a": "c", "b": "c"},
        committed=100,
    ),
    Case(
        "a holder restored past a lagging committed step is a holder",
        quorum("a"),
        table(alive("a", 0, restarted=True), alive("c", 104)),
        ("c",),
        "admitting c",
        catch_up={"a": "c"},
        committed=100,
    ),
    Case(
        "a joiner behind whose source died is never admitted, even though it said ready",
        quorum("a", "b"),
        table(alive("a", failed_at=NOW - 1), alive("b", failed_at=NOW - 1), alive("d", 60, ready_since=NOW - 5),
              alive("e", 0)),
        None,
        "state lost at step 100: no live replica holds it; d at step 60, e at step 0.",
        committed=100,
        lost=100,
    ),
    Case(
        "a joiner level with the committed step by its replay, mid-catch-up, does not hold it",
        quorum("a", "b"),
        table(alive("a", 0, restarted=True), alive("b", 0, restarted=True), alive("d", 100, catching_up=True)),
        None,
        "state lost at step 100: no live replica holds it; d at step 100 (catching up), a at step 0, b at step 0.",
        committed=100,
        lost=100,
    ),
    Case(
        "a diverged replica at the committed step does not hold it",
        quorum("a"),
        table(alive("a", 0, restarted=True), alive("d", 100, diverged=True)),
        None,
        "state lost at step 100: no live replica holds it; d at step 100 (checksum mismatch), a at step 0.",
        committed=100,
        lost=100,
    ),
    Case(
        "a holder behind another holder catches up from it, as any joiner",
        quorum("a"),
        table(alive("a", 0, restarted=True), alive("c", 105), alive("d", 100)),
        ("c",),
        "admitting c",
        catch_up={"a": "c", "d": "c"},
        committed=100,
    ),
    Case(
        "a holder alone is still subject to min_replicas, and the state is not lost",
        quorum("a", "b"),
        table(alive("a", 0, restarted=True), alive("b", 0, restarted=True), alive("c", 100)),
        None,
        "no quorum: 1 healthy replicas, need min_replicas 2",
        rules=dataclasses.replace(RULES, min_replicas=2),
        catch_up={"a": "c", "b": "c"},
        committed=100,
    ),
    Case(
        "silent members may train on: a holder outside the quorum waits join_timeout",
        quorum("a", "b", "c"),
        table(silent("a"), silent("b"), alive("c", 0, restarted=True), alive("d", 100)),
        None,
        "split-brain guard: 2 of 3 members went silent",
        catch_up={"c": "d"},
        committed=100,
    ),
    Case(
        "silent members past join_timeout: the holder forms without them",
        quorum("a", "b", "c"),
        table(silent("a", since=11), silent("b", since=11), alive("c", 0, restarted=True), alive("d", 100)),
        ("d",),
        "admitting d",
        catch_up={"c": "d"},
        committed=100,
    ),
    Case(
        "first quorum: replicas that lost the state are no majority against a holder",
        None,
        table(alive("a", 0), alive("b", 0), alive("c", 0), alive("d", 100)),
        ("d",),
        "admitting d after join_timeout",
        catch_up={"a": "d", "b": "d", "c": "d"},
        committed=100,
    ),
    Case(
        "first quorum without a committed step: the same replicas wait for a majority",
        None,
        table(alive("a", 0), alive("b", 0), alive("c", 0), alive("d", 100)),
        None,
        "split-brain guard: only 1 of 4 live replicas are up to date",
        catch_up={"a": "d", "b": "d", "c": "d"},
    ),
    Case(
        "first quorum with a committed step and no holder: state lost",
        None,
        table(alive("a", 0), alive("b", 3)),
        None,
        "state lost at step 100: no live replica holds it; b at step 3, a at step 0.",
        committed=100,
        lost=100,
    ),
    Case(
        "continuing members are unaffected by the committed step",
        quorum("a", "b", "c"),
        table(alive("a", 90), alive("b", 90), silent("c"), alive("d", 0)),
        ("a", "b"),
        "c (heartbeat timeout)",
        catch_up={"d": "a"},
        committed=100,
    ),
    Case(
        "a brand-new job (committed step 0) is unaffected",
        None,
        table(alive("a", 0), alive("b", 0)),
        ("a", "b"),
        "admitting a, b",
    ),
    Case(
        "given up (committed step reset to 0): the replicas there are form a quorum",
        quorum("a", "b"),
        table(alive("a", 0, restarted=True), alive("b", 0, restarted=True)),
        ("a", "b"),
        "a (restarted), b (restarted); admitting a, b",
    ),
    Case(
        "members a restarted coordinator presumes alive (no step yet) do not vouch for a fresh replica below it",
        quorum("a", "b"),
        table(alive("a", 0), alive("b", 0), alive("c", 0)),
        None,
        "unchanged",
        committed=100,
    ),
    Case(
        "every member left on purpose (finished): the state ended, the next replicas start over",
        quorum("a", "b"),
        table(alive("c", 0)),
        ("c",),
        "a (left), b (left); admitting c",
        committed=100,
        ended=True,
    ),
    Case(
        "one member left on purpose, the other failed: lost",
        quorum("a", "b"),
        table(alive("b", failed_at=NOW - 1), alive("c", 0)),
        None,
        "state lost at step 100: no live replica holds it; c at step 0.",
        committed=100,
        lost=100,
    ),
    Case(
        "a lost state's list of replicas is cut short",
        quorum("a"),
        table(alive("a", 0, restarted=True), *(alive(f"r{i:02d}", 0) for i in range(20))),
        None,
        "a at step 0, r00 at step 0, r01 at step 0, r02 at step 0, r03 at step 0, r04 at step 0, r05 at step 0, "
        "r06 at step 0 and 13 more.",
        committed=100,
        lost=100,
    ),
    Case(
        "long lists in a reason are cut short",
        None,
        table(*(alive(f"r{i:02d}", 0) for i in range(20))),
        tuple(f"r{i:02d}" for i in range(20)),
        "admitting r00, r01, r02, r03, r04, r05, r06, r07 and 12 more: no other replica pending.",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    decision = decide(case.prev, case.replicas, case.now, case.rules, case.prev_catch_up, case.committed)
    got = tuple(m.replica_id for m in decision.members) if decision.members is not None else None
    assert got == case.expect, decision.reason
    assert case.reason in decision.reason
    assert {k: v.replica_id for k, v in decision.catch_up.items()} == case.catch_up
    assert decision.state_lost_step == case.lost, decision.reason
    assert decision.state_ended == case.ended, decision.reason
    assert decision.reason.startswith("state lost at step ") == bool(case.lost)
    if case.lost:
        assert decision.state_lost.startswith("no live replica holds it; ")
        assert decision.reason.startswith(f"state lost at step {case.lost}: {decision.state_lost}.")


def test_joined_quorum_id_kept_for_members_and_set_for_newcomers() -> None:
    prev = quorum("a", "b", qid=7)
    replicas = table(alive("a"), alive("b"), alive("d", 100, ready_since=NOW - 1))
    decision = decide(prev, replicas, NOW, RULES)
    joined = {m.replica_id: m.joined_quorum_id for m in decision.members}
    assert joined == {"a": 3, "b": 3, "d": 8}


def test_reason_is_stable_while_nothing_changes() -> None:
    """The coordinator logs the reason when it changes, so it must not embed the clock."""
    prev = quorum("a", "b", "c")
    replicas = table(alive("a"), silent("b"), silent("c"))
    first = decide(prev, replicas, NOW, RULES).reason
    later = decide(prev, replicas, NOW + 3, RULES).reason
    assert first == later


def test_members_sorted_and_carry_their_step() -> None:
    replicas = table(alive("c", 0), alive("a", 0), alive("b", 0))
    decision = decide(None, replicas, NOW, RULES)
    assert [m.replica_id for m in decision.members] == ["a", "b", "c"]
    assert all(m.joined_quorum_id == 1 for m in decision.members)


def test_members_that_stay_keep_their_entry() -> None:
    """A member's entry does not change while it stays, so that a member list
    can travel as a delta (coordinator/quorum_delta.py)."""
    prev = quorum("a", "b", qid=7)
    replicas = table(alive("a", 140), alive("b", 140), alive("d", 140, ready_since=NOW - 1))
    decision = decide(prev, replicas, NOW, RULES)
    kept = {m.replica_id: m for m in prev.members}
    assert [m for m in decision.members if m.replica_id in kept] == [kept["a"], kept["b"]]
    assert [m.step for m in decision.members if m.replica_id == "d"] == [140]


@pytest.mark.parametrize(
    "reports, joined, expected",
    [
        ({"a": {10: "x"}, "b": {10: "x"}, "c": {10: "x"}}, {"a": 1, "b": 1, "c": 1}, {}),
        ({"a": {10: "x"}, "b": {10: "x"}, "c": {10: "y"}}, {"a": 1, "b": 1, "c": 1}, {"c": 10}),
        # only two of three reported and they differ: no majority yet
        ({"a": {10: "x"}, "c": {10: "y"}}, {"a": 1, "b": 1, "c": 1}, {}),
        # two members, a tie: the later joiner is presumed wrong...
        ({"a": {10: "x", 11: "p"}, "b": {11: "q"}}, {"a": 1, "b": 5}, {"b": 11}),
        # ...unless they joined together
        ({"a": {11: "p"}, "b": {11: "q"}}, {"a": 1, "b": 1}, {}),
        ({"a": {10: "x"}, "b": {11: "y"}}, {"a": 1, "b": 1}, {}),  # no common step
        ({"a": {9: "x", 10: "y"}, "b": {9: "x", 10: "z"}, "c": {10: "z"}}, {"a": 1, "b": 1, "c": 1}, {"a": 10}),
    ],
)
def test_find_diverged(reports, joined, expected):
    from coordinator.quorum import find_diverged

    assert find_diverged(reports, joined) == expected


def test_diverged_member_leaves_and_cannot_rejoin_until_it_restarts():
    replicas = table(alive("a"), alive("b"), alive("c", diverged=True))
    decision = decide(quorum("a", "b", "c"), replicas, NOW, RULES)
    assert [m.replica_id for m in decision.members] == ["a", "b"] and "c (checksum mismatch)" in decision.reason
    assert decide(quorum("a", "b", qid=8), replicas, NOW, RULES).members is None


def _members(*entries: tuple[str, int]) -> tuple[Member, ...]:
    return tuple(Member(rid, f"h:{i}", 1, 0, joined) for i, (rid, joined) in enumerate(entries))


@pytest.mark.parametrize(
    "prev, members, expected",
    [
        # The first quorum vouches for nothing older: its own id.
        (None, _members(("a", 1)), 5),
        # A quorum stored before the field existed (0): unknown, its own id.
        (Quorum(4, _members(("a", 1)), last_drop_id=0), _members(("a", 1), ("b", 5)), 5),
        # Only added: the predecessor's value carries over.
        (Quorum(4, _members(("a", 1)), last_drop_id=2), _members(("a", 1), ("b", 5)), 2),
        # Someone left: this quorum.
        (Quorum(4, _members(("a", 1), ("b", 3)), last_drop_id=2), _members(("a", 1)), 5),
        # Someone left and someone else came: this quorum.
        (Quorum(4, _members(("a", 1), ("b", 3)), last_drop_id=2), _members(("a", 1), ("c", 5)), 5),
        # Restarted (same id, a new incarnation): its old incarnation was dropped.
        (Quorum(4, _members(("a", 1), ("b", 3)), last_drop_id=2), _members(("a", 1), ("b", 5)), 5),
    ],
    ids=["first", "legacy", "grown", "shrunk", "swapped", "restarted"],
)
def test_next_last_drop_id(prev, members, expected) -> None:
    assert next_last_drop_id(prev, 5, members) == expected


@pytest.mark.parametrize(
    "members, configured, expected",
    [(0, 0.2, 0.2), (100, 0.2, 0.2), (1000, 0.2, 0.2), (3000, 0.2, 0.6), (10_000, 0.2, 2.0), (10_001, 0.2, 2.1), (10_000, 5.0, 5.0), (500, 0.0, 0.1)],
)
def test_settle_grows_with_the_quorum(members, configured, expected) -> None:
    assert settle_for(members, configured) == pytest.approx(expected)


_STEPS = st.sampled_from([0, 40, 99, 100, 101])


@st.composite
def _views(draw):
    """Replicas a-c (members of quorum 7, at step 100) and x-z (outsiders), in any state."""
    views = {}
    for rid in "abcxyz":
        if not draw(st.booleans()):
            continue
        catching_up = draw(st.booleans())
        views[rid] = alive(
            rid, draw(_STEPS),
            restarted=rid in "abc" and draw(st.booleans()),
            catching_up=catching_up,
            ready_since=NOW - draw(st.sampled_from([0.1, 20])) if draw(st.booleans()) else None,
            diverged=draw(st.booleans()) and draw(st.booleans()),
            failed_at=NOW - 1 if draw(st.booleans()) and draw(st.booleans()) else None,
            last_heartbeat=NOW - draw(st.sampled_from([1, 6, 20])),
        )
    return views


@settings(max_examples=400, deadline=None)
@given(views=_views(), committed=st.sampled_from([0, 100]), first=st.booleans())
def test_no_replica_without_the_committed_state_is_admitted_or_a_source(views, committed, first):
    """Rule 8 as a property: once no member continues, whatever the replicas'
    states, every new member and every source holds the committed state, and
    a lost state forms nothing."""
    prev = None if first else quorum("a", "b", "c")
    decision = decide(prev, views, NOW, RULES, None, committed)
    live = {i for i, r in views.items() if lost_at(r, NOW, RULES) is None}
    continuing = prev is not None and any(i in live and not views[i].restarted and not views[i].diverged for i in "abc")
    if continuing or not committed:
        assert decision.state_lost_step == 0 and not decision.state_ended
        return
    if prev is not None and not any(i in views for i in "abc"):  # every member left on purpose
        assert decision.state_ended and decision.state_lost_step == 0, decision.reason
        return
    assert not decision.state_ended
    admitted = [m.replica_id for m in decision.members or ()]
    assert all(holds_state(views[i], committed) for i in admitted), decision.reason
    assert all(holds_state(views[s.replica_id], committed) for s in decision.catch_up.values()), decision.reason
    holders = [i for i in live if holds_state(views[i], committed)]
    if decision.state_lost_step:
        assert decision.state_lost_step == committed and decision.members is None and not decision.catch_up
        assert not holders and decision.reason.startswith(f"state lost at step {committed}: ")
    elif not holders:
        assert "split-brain guard" in decision.reason, decision.reason  # not lost yet: members may be cut off
