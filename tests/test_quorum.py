"""The quorum decision, table-driven with an injected clock (no sleeps, no I/O)."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.coordinator.decisions.quorum import decide, settle_for
from fthsdp.coordinator.decisions.quorum_types import Member, Quorum, next_last_drop_id
from tests.harness.quorum_cases import NOW, RULES, Case, alive, check, quorum, silent, table

CASES = [
    Case("first quorum of a new job", None, table(alive("a", 0), alive("b", 0), alive("c", 0)), ("a", "b", "c"),
         "admitting a, b, c"),
    Case("first quorum waits for min_replicas", None, table(alive("a", 0)), None, "need min_replicas 2",
         rules=dataclasses.replace(RULES, min_replicas=2)),
    Case(
        "first quorum needs a majority of the live replicas up to date",
        None,
        table(alive("a", 100), alive("b", 50), alive("c", 50), alive("d", 50)),
        None,
        "split-brain guard: only 1 of 4",
        catch_up={"b": "a", "c": "a", "d": "a"},
    ),
    Case("fast path: every member healthy", quorum("a", "b", "c"), table(alive("a"), alive("b"), alive("c")), None,
         "quorum 7 unchanged"),
    Case("member taken out as hung (no progress while others waited)", quorum("a", "b", "c"),
         table(alive("a"), alive("b"), alive("c", hung_at=NOW - 0.1, hung="hung: no progress at step 100")),
         ("a", "b"), "c (hung: no progress at step 100)"),
    Case("member silent past the heartbeat timeout", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")),
         ("a", "b"), "c (heartbeat timeout)"),
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
    Case("half of two members silent: shrink at once", quorum("a", "b"), table(alive("a"), silent("b")), ("a",),
         "b (heartbeat timeout)"),
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
    Case("draining member leaves", quorum("a", "b", "c"),
         table(alive("a"), alive("b"), alive("c", drain_requested=True)), ("a", "b"), "c (draining)"),
    Case("member that left is forgotten", quorum("a", "b", "c"), table(alive("a"), alive("b")), ("a", "b"), "c (left)"),
    Case(
        "shrink below min_replicas: no quorum",
        quorum("a", "b"),
        table(alive("a"), silent("b")),
        None,
        "need min_replicas 2",
        rules=dataclasses.replace(RULES, min_replicas=2),
    ),
    Case("joiner behind: assigned a source, not admitted", quorum("a", "b"),
         table(alive("a"), alive("b"), alive("d", 0)), None, "unchanged", catch_up={"d": "a"}),
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
        "member admitted from a catch-up loses its source before its first step: it gets another",
        quorum("a", "b", "d"),
        table(alive("a"), alive("d", 97, catching_up=True, ready_since=NOW - 1)),
        ("a", "d"),
        "b (left)",
        catch_up={"d": "a"},
        prev_catch_up={"d": "b"},
    ),
    Case(
        "member still catching up keeps its source and is never one for another joiner",
        quorum("a", "b", "d"),
        table(alive("a"), alive("b"), alive("d", 97, catching_up=True, ready_since=NOW - 1), alive("e", 3)),
        None,
        "unchanged",
        catch_up={"d": "b", "e": "a"},
        prev_catch_up={"d": "b", "e": "d"},
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
        "a fresh job's members that have not said the count they wait for are taken to wait: "
        "a replica at their step joins by its step",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("c", 100), alive("d", 100)),
        ("a", "b", "c", "d"),
        "admitting c, d",
    ),
    Case(
        "a fresh job's members all wait for more than their quorum has, at their step: a replica at it joins by it",
        quorum("a", "b"),
        table(alive("a", wait_for_replicas=3), alive("b", wait_for_replicas=4), alive("c", 100)),
        ("a", "b", "c"),
        "admitting c",
    ),
    Case(
        "a fresh job's members that have the count they wait for may train past their heartbeats: "
        "a replica at their step catches up first",
        quorum("a", "b"),
        table(alive("a", wait_for_replicas=2), alive("b", wait_for_replicas=2), alive("c", 100)),
        None,
        "quorum 7 unchanged",
        catch_up={"c": "a"},
    ),
    Case(
        "a fresh job: one member that may train is enough to make a replica at the head catch up",
        quorum("a", "b"),
        table(alive("a", wait_for_replicas=3), alive("b", wait_for_replicas=1), alive("c", 100)),
        None,
        "quorum 7 unchanged",
        catch_up={"c": "a"},
    ),
    Case(
        "a fresh job whose members may train: a replica that caught up and says it is ready is admitted",
        quorum("a", "b"),
        table(alive("a", wait_for_replicas=1), alive("b", wait_for_replicas=1),
              alive("c", 100, ready_since=NOW - 1, catching_up=True)),
        ("a", "b", "c"),
        "admitting c",
        catch_up={"c": "a"},
        prev_catch_up={"c": "a"},
    ),
    Case(
        "a fresh job's first quorum: each replica starts from its step, whatever count it waits for",
        None,
        table(alive("a", wait_for_replicas=1), alive("b", wait_for_replicas=1), alive("c", wait_for_replicas=1)),
        ("a", "b", "c"),
        "admitting a, b, c",
    ),
    Case(
        "after a drop the members train on: a replica at the head step by their heartbeats catches up first",
        dataclasses.replace(quorum("a", "b"), last_drop_id=5),
        table(alive("a"), alive("b"), alive("c", 100)),
        None,
        "quorum 7 unchanged",
        catch_up={"c": "a"},
    ),
    Case(
        "after a drop, once it caught up and says it is ready, it is admitted",
        dataclasses.replace(quorum("a", "b"), last_drop_id=5),
        table(alive("a"), alive("b"), alive("c", 100, ready_since=NOW - 1, catching_up=True)),
        ("a", "b", "c"),
        "admitting c",
        catch_up={"c": "a"},
        prev_catch_up={"c": "a"},
    ),
    Case(
        "after a drop with no member left, a replica's step vouches for it",
        dataclasses.replace(quorum("a", "b"), last_drop_id=5),
        table(alive("c", 100), alive("d", 100)),
        ("c", "d"),
        "admitting c, d",
    ),
    Case(
        "a first quorum's members start from where they are: no source",
        None,
        table(alive("a"), alive("b"), alive("c")),
        ("a", "b", "c"),
        "",
    ),
    Case(
        "after a drop, a draining member serves no one: the member that stays does",
        dataclasses.replace(quorum("a", "b"), last_drop_id=5),
        table(alive("a", drain_requested=True), alive("b"), alive("c", 100)),
        ("b",),
        "",
        catch_up={"c": "b"},
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
    Case(
        "a member the others cannot reach is dropped at once, with why",
        quorum("a", "b", "c"),
        table(alive("a"), alive("b"), alive("c", unreachable="unreachable from a, b")),
        ("a", "b"),
        "members leaving: c (unreachable from a, b)",
    ),
    Case(
        "an unreachable replica is neither admitted nor given a source while it stays so",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("c", 100, ready_since=NOW - 5, unreachable="unreachable from a, b"),
              alive("d", 50, unreachable="unreachable from a")),
        None,
        "quorum 7 unchanged",
    ),
    Case(
        "once it reaches them again it catches up like any joiner",
        quorum("a", "b"),
        table(alive("a"), alive("b"), alive("c", 50)),
        None,
        "quorum 7 unchanged",
        catch_up={"c": "a"},
    ),
]


def test_regroup_forms_the_same_members_in_a_new_quorum() -> None:
    prev = quorum("a", "b", "c")
    views = table(alive("a"), alive("b"), alive("c"))
    decision = decide(prev, views, NOW, RULES, regroup="every member waited 12s in the all-reduce of step 100")
    assert decision.regroup and tuple(m.replica_id for m in decision.members) == ("a", "b", "c")
    assert decision.members == prev.members  # the same incarnations: nobody is a joiner
    assert "regrouping the members of quorum 7: every member waited 12s" in decision.reason


def test_a_loss_wins_over_a_regroup() -> None:
    decision = decide(quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")), NOW, RULES,
                      regroup="stuck")
    assert not decision.regroup and tuple(m.replica_id for m in decision.members) == ("a", "b")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    check(case)


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
    can travel as a delta (fthsdp/core/quorum_delta.py)."""
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
    from fthsdp.coordinator.job.checksum_vote import find_diverged

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
    [(0, 0.2, 0.2), (100, 0.2, 0.2), (1000, 0.2, 0.2), (3000, 0.2, 0.6), (10_000, 0.2, 2.0), (10_001, 0.2, 2.1),
     (10_000, 5.0, 5.0), (500, 0.0, 0.1)],
)
def test_settle_grows_with_the_quorum(members, configured, expected) -> None:
    assert settle_for(members, configured) == pytest.approx(expected)
