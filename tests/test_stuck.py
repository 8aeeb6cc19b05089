"""A stuck collective's escalation, table-driven (fthsdp/coordinator/decisions/stuck.py,
fthsdp/coordinator/decisions/hang.py find_stuck, fthsdp/coordinator/decisions/reach_book.py)."""

from __future__ import annotations

import pytest

from fthsdp.coordinator.decisions.hang import Report, Stuck, find_stuck
from fthsdp.coordinator.decisions.reach_book import ReachBook
from fthsdp.coordinator.decisions.stuck import (
    PROBE_WAIT,
    Act,
    Escalation,
    Stage,
    escalate,
    largest_clique,
    merge_reports,
)
from fthsdp.protos.v1 import coordinator_pb2 as pb

AR, COMPUTE = pb.PHASE_ALLREDUCE, pb.PHASE_COMPUTE
NOW = 100.0


def rep(phase: int, age: float, step: int = 40, received: float = NOW) -> Report:
    return Report(phase, age, step, received)


def ranks(*reports: Report) -> dict[int, Report]:
    return dict(enumerate(reports))


@pytest.mark.parametrize(
    "name, members, since, expected",
    [
        ("every member waits past the limit",
         {"a": ranks(rep(AR, 12)), "b": ranks(rep(AR, 11)), "c": ranks(rep(AR, 13))}, float("-inf"), (40, 0, 11.0)),
        ("one member computes: not stuck", {"a": ranks(rep(AR, 12)), "b": ranks(rep(COMPUTE, 11))}, float("-inf"),
         None),
        ("one has waited less than the limit", {"a": ranks(rep(AR, 12)), "b": ranks(rep(AR, 3))}, float("-inf"), None),
        ("finished for one member only (a link failed at its end): stuck at the lower step",
         {"a": ranks(rep(AR, 12, 41)), "b": ranks(rep(AR, 12, 40)), "c": ranks(rep(AR, 12, 40))}, float("-inf"),
         (40, 0, 12.0)),
        ("two steps apart: somebody moved", {"a": ranks(rep(AR, 12, 42)), "b": ranks(rep(AR, 12, 40))},
         float("-inf"), None),
        ("waits count from the quorum's start (a regroup)", {"a": ranks(rep(AR, 30)), "b": ranks(rep(AR, 30))},
         NOW - 6, None),
        ("... and past the limit within it", {"a": ranks(rep(AR, 30)), "b": ranks(rep(AR, 30))}, NOW - 10,
         (40, 0, 10.0)),
        ("a single member is never stuck with anyone", {"a": ranks(rep(AR, 100))}, float("-inf"), None),
        ("rank 1's collective stuck while rank 0 computes",
         {"a": ranks(rep(COMPUTE, 1), rep(AR, 20)), "b": ranks(rep(COMPUTE, 1), rep(AR, 20))}, float("-inf"),
         (40, 1, 20.0)),
    ],
)
def test_find_stuck(name, members, since, expected) -> None:
    got = find_stuck(members, 10.0, since)
    assert (None if got is None else (got.step, got.rank, got.waited)) == expected, name


def test_stuck_reason_says_nobody_is_to_blame() -> None:
    assert "all 3 members have waited 12.0s in the all-reduce of step 40 (limit 10.0s) with nobody to blame" in \
        Stuck(40, 0, 12.0).reason(3, 10.0)


MEMBERS = ("r0", "r1", "r2")
STUCK = Stuck(40, 0, 11.0)


def reach(*cut: tuple[str, str], members=MEMBERS) -> dict[str, dict[str, bool]]:
    out = {a: {b: True for b in members if b != a} for a in members}
    for a, b in cut:
        out[a][b] = out[b][a] = False
    return out


ALL = frozenset(MEMBERS)


@pytest.mark.parametrize(
    "name, esc, stuck, quorum_id, low, reach_, reported, now, act, stage",
    [
        ("nothing stuck: nothing to do", Escalation(), None, 7, 40, {}, frozenset(), NOW, Act.NOTHING, Stage.WATCHING),
        ("stuck: regroup first", Escalation(), STUCK, 7, 40, {}, frozenset(), NOW, Act.REGROUP, Stage.REGROUPED),
        ("the regroup is not in place yet", Escalation(Stage.REGROUPED, 40, 7), STUCK, 7, 40, {}, frozenset(), NOW,
         Act.NOTHING, Stage.REGROUPED),
        ("the regrouped collective has not waited the limit", Escalation(Stage.REGROUPED, 40, 7), None, 8, 40, {},
         frozenset(), NOW, Act.NOTHING, Stage.REGROUPED),
        ("the regroup mended it: the members moved on", Escalation(Stage.REGROUPED, 40, 7), None, 8, 41, {},
         frozenset(), NOW, Act.NOTHING, Stage.WATCHING),
        ("stuck again after the regroup: probe", Escalation(Stage.REGROUPED, 40, 7), STUCK, 8, 40, {}, frozenset(), NOW,
         Act.PROBE, Stage.PROBING),
        ("probing: answers still coming", Escalation(Stage.PROBING, 40, 8, 1, NOW - 1), STUCK, 8, 40, reach(),
         frozenset({"r0"}), NOW, Act.NOTHING, Stage.PROBING),
        ("a down link on r2: r2 is taken out", Escalation(Stage.PROBING, 40, 8, 1, NOW - 1), STUCK, 8, 40,
         reach(("r0", "r2"), ("r1", "r2")), ALL, NOW, Act.TAKE_OUT, Stage.WATCHING),
        ("everyone reaches everyone: slow, not cut", Escalation(Stage.PROBING, 40, 8, 1, NOW - 1), STUCK, 8, 40,
         reach(), ALL, NOW, Act.KEEP, Stage.SLOW),
        ("an answer missing past the wait: decided with the others",
         Escalation(Stage.PROBING, 40, 8, 1, NOW - PROBE_WAIT), STUCK, 8, 40,
         {"r0": {"r1": True, "r2": False}, "r1": {"r0": True, "r2": False}}, frozenset({"r0", "r1"}), NOW,
         Act.TAKE_OUT, Stage.WATCHING),
        ("slow: after another limit, regroup again", Escalation(Stage.SLOW, 40, 8, 1, NOW - 10), STUCK, 8, 40, {},
         frozenset(), NOW, Act.REGROUP, Stage.REGROUPED),
        ("slow: within the limit, wait", Escalation(Stage.SLOW, 40, 8, 1, NOW - 3), STUCK, 8, 40, {}, frozenset(), NOW,
         Act.NOTHING, Stage.SLOW),
        ("the quorum changed while probing (a member lost): start over", Escalation(Stage.PROBING, 40, 8, 1, NOW - 1),
         STUCK, 9, 40, reach(), ALL, NOW, Act.NOTHING, Stage.WATCHING),
    ],
)
def test_escalate(name, esc, stuck, quorum_id, low, reach_, reported, now, act, stage) -> None:
    got, action = escalate(esc, stuck, MEMBERS, quorum_id, low, reach_, reported, now, 10.0)
    assert (action.act, got.stage) == (act, stage), f"{name}: {action.reason}"


def test_take_out_names_whom_it_cannot_reach() -> None:
    _, action = escalate(Escalation(Stage.PROBING, 40, 8, 1, NOW - 1), STUCK, MEMBERS, 8, 40,
                         reach(("r0", "r2"), ("r1", "r2")), ALL, NOW, 10.0)
    assert dict(action.take_out) == {"r2": "unreachable from r0, r1 over the data path (probe 1, step 40)"}
    assert "keeping r0, r1, which all reach one another" in action.reason


@pytest.mark.parametrize(
    "name, members, cut, expected",
    [
        ("no cut", MEMBERS, [], ["r0", "r1", "r2"]),
        ("one node cut off", MEMBERS, [("r0", "r2"), ("r1", "r2")], ["r0", "r1"]),
        ("a cut between two, each reaching the third: keep the lowest ids", MEMBERS, [("r0", "r1")], ["r0", "r2"]),
        ("nobody reaches anybody: one is kept", MEMBERS, [("r0", "r1"), ("r0", "r2"), ("r1", "r2")], ["r0"]),
        ("four with no three all linked: the linked pair with the lowest ids", ("a", "b", "c", "d"),
         [("a", "c"), ("a", "d"), ("b", "c")], ["a", "b"]),
        ("four where b, c, d are all linked", ("a", "b", "c", "d"), [("a", "c"), ("a", "d")], ["b", "c", "d"]),
        ("a larger job, greedily (above the exact limit)", tuple(f"r{i:02d}" for i in range(30)),
         [("r05", f"r{i:02d}") for i in range(30) if i != 5], [f"r{i:02d}" for i in range(30) if i != 5]),
    ],
)
def test_largest_clique(name, members, cut, expected) -> None:
    assert largest_clique(members, reach(*cut, members=members)) == expected, name


def test_merge_reports_a_replica_reaches_a_peer_only_if_every_rank_does() -> None:
    table, complete = merge_reports(
        {"a": {0: (frozenset({"b"}), frozenset()), 1: (frozenset(), frozenset({"b"}))},
         "b": {0: (frozenset({"a"}), frozenset())}},
        {"a": 2, "b": 2},
    )
    assert table == {"a": {"b": False}, "b": {"a": True}}
    assert complete == {"a"}  # b's rank 1 did not answer


def test_reach_book_from_stuck_to_take_out_and_back() -> None:
    book = ReachBook()
    sizes = {m: 1 for m in MEMBERS}
    addresses = {m: (f"{m}:1",) for m in MEMBERS}
    reads: list[int] = []

    def low_step() -> int:  # a pass over every rank's report: read only once an escalation is under way
        reads.append(40)
        return 40

    assert book.look(STUCK, MEMBERS, 7, low_step, sizes, addresses, NOW, 10.0).act is Act.REGROUP
    assert reads == [], "not read while watching"
    assert "regrouping them" in book.regroup
    book.quorum_changed()
    assert book.regroup == ""
    assert book.look(STUCK, MEMBERS, 8, low_step, sizes, addresses, NOW + 11, 10.0).act is Act.PROBE
    probe = book.probe_for("r0", is_member=True)
    assert [t.replica_id for t in probe.targets] == list(MEMBERS) and probe.targets[2].addresses == ["r2:1"]
    book.answer("r0", 0, probe.id, ["r1"], ["r2"], 1)
    book.answer("r1", 0, probe.id, ["r0"], ["r2"], 1)
    book.answer("r2", 0, probe.id, [], ["r0", "r1"], 1)
    book.answer("r2", 0, probe.id + 99, ["r0", "r1"], [], 1)  # a stale or made-up probe id counts for nothing
    action = book.look(STUCK, MEMBERS, 8, low_step, sizes, addresses, NOW + 12, 10.0)
    assert action.act is Act.TAKE_OUT and set(action.take_out) == {"r2"}
    assert len(reads) == 2
    assert book.probe_for("r0", is_member=True) is None
    # r2, kept out, is asked to probe the members now and then; it is let back once it reaches them all.
    members = ["r0", "r1"]
    assert book.reprobe(["r2"], members, addresses, NOW + 13)
    assert not book.reprobe(["r2"], members, addresses, NOW + 14)  # not before REPROBE_EVERY
    again = book.probe_for("r2", is_member=False)
    assert [t.replica_id for t in again.targets] == members
    back = book.answer("r2", 0, again.id, ["r0"], ["r1"], 1)
    assert back is not None and not back.reaches_all and back.unreached == ("r1",)
    assert book.reprobe(["r2"], members, addresses, NOW + 17)
    newer = book.probe_for("r2", is_member=False)
    assert newer.id > again.id
    back = book.answer("r2", 0, newer.id, ["r0", "r1"], [], 1)
    assert back is not None and back.reaches_all
