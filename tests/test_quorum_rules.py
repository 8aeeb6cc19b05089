"""The quorum rules one by one (fthsdp/coordinator/decisions/quorum_rules.py), a table each.

Each row sorts made-up replica views at an injected time (``classify``) and
asks one rule: it either passes (None: it does not apply, the next rule
decides) or answers with the members it forms (None: keep the current
quorum) and a reason. tests/test_quorum*.py check the same rules through
``decide``; these check that each rule answers exactly where it applies.
"""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.coordinator.decisions import quorum_rules as rule
from fthsdp.coordinator.decisions.quorum import ORDER, decide
from fthsdp.coordinator.decisions.quorum_outcome import catch_up_sources, new_members
from fthsdp.coordinator.decisions.quorum_situation import Situation, classify
from fthsdp.coordinator.decisions.quorum_types import Decision, Outage, Quorum, ReplicaView, Restoring, Rules
from tests.harness.quorum_cases import NOW, RULES, alive, awaited, quorum, silent, table

PASSES = "passes"
"""Expected where the rule does not apply."""


@dataclasses.dataclass
class Row:
    prev: Quorum | None
    views: dict[str, ReplicaView]
    expect: tuple[str, ...] | None | str
    """The members formed; None: keep the current quorum; PASSES: the rule does not apply."""
    reason: str = ""
    """A fragment of the reason expected."""
    rules: Rules = RULES
    now: float = NOW
    committed: int = 0
    regroup: str = ""
    restoring: Restoring | None = None
    prev_catch_up: dict[str, str] = dataclasses.field(default_factory=dict)
    outage: Outage | None = None

    def situation(self) -> Situation:
        return classify(self.prev, self.views, self.now, self.rules, self.prev_catch_up, self.committed,
                        self.regroup, self.restoring, self.outage)


def asked(applies: rule.Rule, row: Row) -> Decision | None:
    """The rule's answer, checked against the row's expectation."""
    d = applies(row.situation())
    if row.expect == PASSES:
        assert d is None, d.reason if d is not None else ""
        return None
    assert d is not None, "the rule passed"
    got = tuple(m.replica_id for m in d.members) if d.members is not None else None
    assert got == row.expect, d.reason
    assert row.reason in d.reason
    return d


def row(name: str, *args, **kw):
    return pytest.param(Row(*args, **kw), id=name)


def trio() -> dict[str, ReplicaView]:
    return table(alive("a"), alive("b"), alive("c"))


SLOW = dataclasses.replace(RULES, join_settle=2.0)
TWO = dataclasses.replace(RULES, min_replicas=2)


FAST_PATH = [
    row("every member healthy: keep", quorum("a", "b", "c"), trio(), None,
        "quorum 7 unchanged: all 3 members healthy."),
    row("a member behind the others still keeps the quorum", quorum("a", "b"), table(alive("a"), alive("b", 90)),
        None, "quorum 7 unchanged"),
    row("a ready joiner: passes to growth", quorum("a", "b"), trio(), PASSES),
    row("a member lost: passes to shrink", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")),
        PASSES),
    row("a member draining: passes to shrink", quorum("a", "b"), table(alive("a"), alive("b", drain_requested=True)),
        PASSES),
    row("no quorum yet: passes", None, trio(), PASSES),
]


@pytest.mark.parametrize("case", FAST_PATH)
def test_rule_2_fast_path(case: Row):
    asked(rule.fast_path, case)


@pytest.mark.parametrize("case, settled", [
    pytest.param(Row(quorum("a", "b"), table(alive("a"), alive("b")), None), True, id="nobody pending: settled"),
    pytest.param(Row(quorum("a", "b"), table(alive("a"), alive("b"), alive("c", 50)), None), False,
                 id="an outsider catching up: not settled"),
    pytest.param(Row(quorum("a", "b"), table(alive("a"), awaited("b", started=1)), None), False,
                 id="a member not back since the coordinator started: not settled"),
])
def test_rule_2_is_settled_only_with_nothing_to_wait_for(case: Row, settled: bool):
    d = asked(rule.fast_path, case)
    assert d is not None and d.settled is settled


REGROUP = [
    row("a stuck collective: the same members in a new quorum", quorum("a", "b", "c"), trio(), ("a", "b", "c"),
        "regrouping the members of quorum 7: stuck all-reduce.", regroup="stuck all-reduce"),
    row("ready joiners come along", quorum("a", "b"), trio(), ("a", "b", "c"), "regrouping the members of quorum 7",
        regroup="stuck all-reduce"),
    row("nothing stuck: passes", quorum("a", "b", "c"), trio(), PASSES),
    row("a member leaving: passes to shrink", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")),
        PASSES, regroup="stuck all-reduce"),
    row("no quorum yet: passes", None, trio(), PASSES, regroup="stuck all-reduce"),
]


@pytest.mark.parametrize("case", REGROUP)
def test_rule_3_regroup_members(case: Row):
    d = asked(rule.regroup_members, case)
    assert d is None or d.regroup


SHRINK = [
    row("silent member", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")), ("a", "b"),
        "members leaving: c (heartbeat timeout)."),
    row("failed member", quorum("a", "b"), table(alive("a"), alive("b", failed_at=NOW - 1)), ("a",),
        "members leaving: b (reported failed)."),
    row("draining member", quorum("a", "b"), table(alive("a"), alive("b", drain_requested=True)), ("a",),
        "b (draining)"),
    row("restarted member", quorum("a", "b"), table(alive("a"), alive("b", 0, restarted=True)), ("a",),
        "b (restarted)"),
    row("diverged member", quorum("a", "b"), table(alive("a"), alive("b", diverged=True)), ("a",),
        "b (checksum mismatch)"),
    row("unreachable member", quorum("a", "b"), table(alive("a"), alive("b", unreachable="unreachable from a")),
        ("a",), "b (unreachable from a)"),
    row("a member that left has no view", quorum("a", "b"), table(alive("a")), ("a",), "b (left)"),
    row("ready joiners admitted in the same change", quorum("a", "b"), table(alive("a"), silent("b"), alive("c")),
        ("a", "c"), "members leaving: b (heartbeat timeout); admitting c."),
    row("a restore's first quorum says why it forms now", quorum("a", "b"),
        table(alive("a", failed_at=NOW - 5), alive("c", 40, step_since=NOW - 11)), ("c",),
        "; join_timeout 10s passed since the first replica loaded the checkpoint of step 40; a, b",
        committed=40, restoring=Restoring(frozenset({"a", "b"}), 7)),
    row("nobody leaving: passes", quorum("a", "b"), trio(), PASSES),
    row("no quorum yet: passes", None, trio(), PASSES),
]


@pytest.mark.parametrize("case", SHRINK)
def test_rule_3_shrink(case: Row):
    asked(rule.shrink, case)


SPLIT_BRAIN_MEMBERS = [
    row("2 of 3 silent at once: wait", quorum("a", "b", "c"), table(alive("a"), silent("b"), silent("c")), None,
        "split-brain guard: 2 of 3 members went silent at once; waiting up to join_timeout 10s"),
    row("streams closed count as silence", quorum("a", "b", "c"),
        table(alive("a"), alive("b", disconnected_at=NOW - 1), alive("c", disconnected_at=NOW - 1)), None,
        "2 of 3 members went silent"),
    row("silent longer than join_timeout: passes", quorum("a", "b", "c"),
        table(alive("a"), silent("b", since=11), silent("c", since=12)), PASSES),
    row("the latest silence counts: one recent enough waits", quorum("a", "b", "c"),
        table(alive("a"), silent("b", since=30), silent("c", since=1)), None, "split-brain guard"),
    row("exactly half: passes", quorum("a", "b"), table(alive("a"), silent("b")), PASSES),
    row("explicit failures are no silence: passes", quorum("a", "b", "c"),
        table(alive("a"), alive("b", failed_at=NOW - 1), alive("c", failed_at=NOW - 1)), PASSES),
    row("members that left are no silence: passes", quorum("a", "b", "c"), table(alive("a")), PASSES),
    row("1 of 3 silent, another quiet for over half the timeout: a cut's timeouts run out one by one, wait",
        quorum("a", "b", "c"), table(alive("a"), alive("b", last_heartbeat=NOW - 3), silent("c")), None,
        "split-brain guard: 1 of 3 members went silent and 1 more have been quiet for over half the heartbeat "
        "timeout; waiting up to join_timeout 10s"),
    row("... not one quiet for less: passes", quorum("a", "b", "c"),
        table(alive("a"), alive("b", last_heartbeat=NOW - 2), silent("c")), PASSES),
    row("nobody leaving: passes", quorum("a", "b", "c"), trio(), PASSES),
    row("no quorum yet: passes", None, table(alive("a"), silent("b"), silent("c")), PASSES),
    row("most of an outage back: the rest of it waits", quorum("a", "b", "c"),
        table(alive("a"), alive("b"), silent("c")), None,
        "split-brain guard: 3 of 3 members went silent at once and 2 are back; waiting up to join_timeout 10s "
        "past the latest silence for c before shrinking without them.",
        outage=Outage(7, frozenset("abc"), NOW + 4)),
    row("an outage's wait over: passes", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")), PASSES,
        outage=Outage(7, frozenset("abc"), NOW)),
    row("a silence outside the outage: passes", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")),
        PASSES, outage=Outage(7, frozenset("ab"), NOW + 4)),
    row("another quorum's outage: passes", quorum("a", "b", "c"), table(alive("a"), alive("b"), silent("c")),
        PASSES, outage=Outage(6, frozenset("abc"), NOW + 4)),
    row("an outage's members back, one drains: passes", quorum("a", "b", "c"),
        table(alive("a"), alive("b"), alive("c", drain_requested=True)), PASSES,
        outage=Outage(7, frozenset("abc"), NOW + 4)),
]


@pytest.mark.parametrize("case", SPLIT_BRAIN_MEMBERS)
def test_rule_4_split_brain_guard_on_members(case: Row):
    asked(rule.split_brain_members, case)


def test_rule_4_remembers_who_went_silent_and_until_when():
    """The guard's answer carries its wait to the next decision: every member
    silent now, those of a wait already under way, and the later end."""
    d = asked(rule.split_brain_members, Row(quorum("a", "b", "c"), table(alive("a"), silent("b", since=3),
                                                                           silent("c", since=1)), None))
    assert d is not None and d.outage == Outage(7, frozenset("bc"), NOW - 1 + RULES.join_timeout)
    d = asked(rule.split_brain_members, Row(quorum("a", "b", "c"), table(alive("a"), silent("b", since=3),
                                                                           silent("c", since=1)), None,
                                            outage=Outage(7, frozenset("ab"), NOW + 20)))
    assert d is not None and d.outage == Outage(7, frozenset("abc"), NOW + 20)
    # Members only quiet are no outage yet: if they beat again, the silent one alone is dropped.
    d = asked(rule.split_brain_members, Row(quorum("a", "b", "c"), table(alive("a"), alive("b", last_heartbeat=NOW - 3),
                                                                           silent("c")), None))
    assert d is not None and d.outage is None


def test_a_healed_cut_keeps_the_member_a_moment_behind():
    """Through ``decide`` as the coordinator runs it, each decision's outage
    passed to the next: all three members silent, two back, the third back
    a second later: the quorum never changes. Without the wait passed on,
    the third is dropped the moment the other two are back."""
    prev = quorum("a", "b", "c")
    cut = table(silent("a"), silent("b"), silent("c"))
    first = decide(prev, cut, NOW, RULES)
    assert first.members is None and first.outage is not None
    two_back = table(alive("a"), alive("b"), silent("c"))
    assert decide(prev, two_back, NOW + 1, RULES).members is not None  # the wait forgotten: c dropped
    second = decide(prev, two_back, NOW + 1, RULES, outage=first.outage)
    assert second.members is None and second.outage == first.outage, second.reason
    end = first.outage.until
    heard = {"last_heartbeat": end - 1}
    third = decide(prev, table(alive("a", **heard), alive("b", **heard), silent("c")), end, RULES,
                   outage=second.outage)
    assert third.members is not None and [m.replica_id for m in third.members] == ["a", "b"], third.reason
    back = decide(prev, trio(), NOW + 2, RULES, outage=second.outage)
    assert back.members is None and back.outage is None and "unchanged" in back.reason


SPLIT_BRAIN_FIRST = [
    row("1 of 4 up to date: wait for a majority", None,
        table(alive("a", 100), alive("b", 50), alive("c", 50), alive("d", 50)), None,
        "split-brain guard: only 1 of 4 live replicas are up to date; waiting for a majority."),
    row("2 of 4 is no majority", None, table(alive("a"), alive("b"), alive("c", 50), alive("d", 50)), None,
        "only 2 of 4 live replicas"),
    row("2 of 3: passes", None, table(alive("a"), alive("b"), alive("c", 50)), PASSES),
    row("only holders vote while the state is guarded", None,
        table(alive("a", 100), alive("b", 100, beating=False), alive("c", 0)), None,
        "only 1 of 2 live replicas holding the committed state are up to date", committed=100),
    row("a replica below the committed step has no vote: passes", None,
        table(alive("a", 100), alive("b", 0), alive("c", 0)), PASSES, committed=100),
    row("a quorum exists: passes", quorum("a"), table(alive("a"), alive("b", 50), alive("c", 50)), PASSES),
]


@pytest.mark.parametrize("case", SPLIT_BRAIN_FIRST)
def test_rule_4_split_brain_guard_on_a_first_quorum(case: Row):
    asked(rule.split_brain_first, case)


TOO_FEW = [
    row("a first quorum waits for min_replicas", None, table(alive("a")), None,
        "waiting for replicas: 1 ready, need min_replicas 2.", rules=TWO),
    row("no shrinking below min_replicas", quorum("a", "b"), table(alive("a"), silent("b")), None,
        "no quorum: 1 healthy replicas, need min_replicas 2.", rules=TWO),
    row("a joiner makes up for a member leaving: passes", quorum("a", "b"),
        table(alive("a"), silent("b"), alive("c")), PASSES, rules=TWO),
    row("a draining member does not count", quorum("a", "b"), table(alive("a"), alive("b", drain_requested=True)),
        None, "no quorum: 1 healthy replicas", rules=TWO),
    row("enough: passes", None, table(alive("a"), alive("b")), PASSES, rules=TWO),
]


@pytest.mark.parametrize("case", TOO_FEW)
def test_rule_5_min_replicas(case: Row):
    asked(rule.too_few, case)


GROW = [
    row("nobody else pending: admit", None, table(alive("a", 0), alive("b", 0)), ("a", "b"),
        "admitting a, b: no other replica pending."),
    row("joiners join the staying members", quorum("a"), table(alive("a"), alive("b")), ("a", "b"),
        "admitting b: no other replica pending."),
    row("a recent arrival: wait for the burst to settle", quorum("a"),
        table(alive("a"), alive("b", registered_at=NOW - 1)), None,
        "waiting for arrivals to settle (join_settle 2s) before admitting b.", rules=SLOW),
    row("a settled burst: admit", quorum("a"), table(alive("a"), alive("b", registered_at=NOW - 3)), ("a", "b"),
        "admitting b", rules=SLOW),
    row("join_timeout caps the settle", quorum("a"),
        table(alive("a"), alive("b", ready_since=NOW - 11), alive("c", ready_since=NOW - 0.5)), ("a", "b", "c"),
        "admitting b, c: no other replica pending.", rules=SLOW),
    row("others still catching up: wait for them", quorum("a"),
        table(alive("a"), alive("b", ready_since=NOW - 1), alive("c", 50, catching_up=True)), None,
        "waiting up to join_timeout 10s for 1 catching-up replicas before admitting b."),
    row("join_timeout since the first ready joiner: admit without them", quorum("a"),
        table(alive("a"), alive("b", ready_since=NOW - 10), alive("c", 50, catching_up=True)), ("a", "b"),
        "admitting b after join_timeout 10s; 1 still catching up."),
    row("a replica not heartbeating yet is not admitted", quorum("a"), table(alive("a"), alive("b", beating=False)),
        PASSES),
    row("a cordoned replica is not admitted", quorum("a"), table(alive("a"), alive("b", cordoned=True)), PASSES),
    row("nobody ready: passes", quorum("a"), table(alive("a"), alive("b", 50)), PASSES),
]


@pytest.mark.parametrize("case", GROW)
def test_rule_6_grow_in_batches(case: Row):
    asked(rule.grow, case)


def lease(rid: str, step: int = 100, **kw) -> ReplicaView:
    """A member cut from the coordinator (silent) whose last lease runs 3 s more."""
    return dataclasses.replace(silent(rid, since=1, step=step, **kw), lease_until=NOW + 3)


MEMBER_LEASES = [
    row("no member carries on: wait out the leases", quorum("a", "b"),
        table(lease("a"), alive("b", failed_at=NOW - 1), alive("c")), None,
        "member lease: waiting for a of quorum 7 to stop committing", ),
    row("before a quorum without them", quorum("a"), table(lease("a"), alive("c")), None,
        "before a quorum without them."),
    row("before declaring the state lost", quorum("a"), table(lease("a"), alive("c", 0)), None,
        "before declaring the state lost.", committed=100),
    row("leases lapsed: passes", quorum("a", "b"),
        table(silent("a", lease_until=NOW - 1), alive("b", failed_at=NOW - 1), alive("c")), PASSES),
    row("a member carries on: passes", quorum("a", "b"), table(alive("a"), lease("b")), PASSES),
    row("no quorum yet: passes", None, table(lease("a"), alive("c")), PASSES),
]


@pytest.mark.parametrize("case", MEMBER_LEASES)
def test_rule_8_member_leases(case: Row):
    d = asked(rule.member_leases, case)
    assert d is None or d.leased == ("a",)


STATE_LOST = [
    row("no member carries on, nobody holds the step", quorum("a"), table(silent("a"), alive("b", 0)), None,
        "state lost at step 100: no live replica holds it; b at step 0.", committed=100),
    row("a replica at the step mid-catch-up holds nothing", quorum("a"),
        table(silent("a"), alive("b", 100, catching_up=True)), None, "b at step 100 (catching up)", committed=100),
    row("a diverged replica at the step holds nothing", quorum("a"), table(silent("a"), alive("b", diverged=True)),
        None, "b at step 100 (checksum mismatch)", committed=100),
    row("nobody alive", quorum("a"), table(silent("a")), None,
        "state lost at step 100: no live replica holds it; no replica is alive.", committed=100),
    row("a new job's first quorum with a committed step nobody holds", None, table(alive("a", 0)), None,
        "state lost at step 100", committed=100),
    row("a holder outside the quorum: passes", quorum("a"), table(silent("a"), alive("b", 100)), PASSES,
        committed=100),
    row("a member carries on: passes", quorum("a", "b"), table(alive("a", 0), silent("b")), PASSES, committed=100),
    row("every member left on purpose, the state ended: passes", quorum("a"), table(alive("b", 0)), PASSES,
        committed=100),
    row("no committed step: passes", quorum("a"), table(silent("a"), alive("b", 0)), PASSES),
]


@pytest.mark.parametrize("case", STATE_LOST)
def test_rule_8_state_lost(case: Row):
    d = asked(rule.state_lost, case)
    if d is not None:
        assert d.state_lost_step == case.committed
        assert d.reason.startswith(f"state lost at step {case.committed}: {d.state_lost}.")


def loaded(rid: str, since: float = 1.0) -> ReplicaView:
    """A new incarnation that loaded the checkpoint of step 40 ``since`` seconds ago."""
    return alive(rid, 40, restarted=True, registered_at=NOW - since - 4, first_heartbeat=NOW - since - 3,
                 step_since=NOW - since)


def loading(rid: str, **kw) -> ReplicaView:
    """A new incarnation still loading the checkpoint (at step 0)."""
    return alive(rid, 0, restarted=True, **kw)


LOST = Restoring(frozenset({"a", "b"}), 7)


RESTORE = [
    row("the first to load waits for the other member", quorum("a", "b"), table(loaded("a"), loading("b")), None,
        "restored the checkpoint of step 40: waiting up to join_timeout 10s for b (a member when the state was "
        "lost; quorum 7 trained the last step) before admitting a.", committed=40, restoring=LOST),
    row("a member with no view yet is waited for", quorum("a", "b"), table(loaded("a")), None,
        "waiting up to join_timeout 10s for b", committed=40, restoring=LOST),
    row("join_timeout since the first loaded: passes", quorum("a", "b"), table(loaded("a", 10), loading("b")),
        PASSES, committed=40, restoring=LOST),
    row("every member back: passes", quorum("a", "b"), table(loaded("a"), loaded("b")), PASSES, committed=40,
        restoring=LOST),
    row("a cordoned member is not waited for: passes", quorum("a", "b"),
        table(loaded("a"), loading("b", cordoned=True)), PASSES, committed=40, restoring=LOST),
    row("nobody loaded yet: passes (the state is lost until one does)", quorum("a", "b"),
        table(loading("a"), loading("b")), PASSES, committed=40, restoring=LOST),
    row("no restore under way: passes", quorum("a", "b"), table(loaded("a"), loading("b")), PASSES, committed=40),
    row("no quorum since the loss: passes", None, table(loaded("a"), loading("b")), PASSES, committed=40,
        restoring=LOST),
]


@pytest.mark.parametrize("case", RESTORE)
def test_rule_9_restore_first_quorum(case: Row):
    asked(rule.restore_first_quorum, case)


@dataclasses.dataclass
class Sources:
    row: Row
    members: tuple[str, ...] | None
    """The quorum the answer forms (None: keep the current one)."""
    expect: dict[str, str]
    """Replica to its source."""


CATCH_UP = [
    pytest.param(Sources(Row(quorum("a", "b"), table(alive("a"), alive("b"), alive("c", 50)), None), None,
                         {"c": "a"}), id="a replica behind gets a member, the first by id"),
    pytest.param(Sources(Row(quorum("a", "b"), table(alive("a"), alive("b"), alive("c", 50), alive("d", 50)), None),
                         None, {"c": "a", "d": "b"}), id="spread over the members"),
    pytest.param(Sources(Row(quorum("a", "b"), table(alive("a"), alive("b"), alive("c", 50)), None,
                             prev_catch_up={"c": "b"}), None, {"c": "b"}), id="sticky while its source stays"),
    pytest.param(Sources(Row(quorum("a", "b"), table(alive("a"), alive("c", 50)), None,
                             prev_catch_up={"c": "b"}), ("a",), {"c": "a"}), id="moved when its source is lost"),
    pytest.param(Sources(Row(quorum("a", "b"), table(alive("a", drain_requested=True), alive("b"),
                                                     alive("c", 50)), None), ("b",), {"c": "b"}),
                 id="a draining member is no source"),
    pytest.param(Sources(Row(quorum("a", "b"), table(alive("a"), alive("b", catching_up=True, ready_since=NOW - 1),
                                                     alive("c", 50)), None), None, {"b": "a", "c": "a"}),
                 id="a member still catching up gets a source and is none"),
    pytest.param(Sources(Row(None, table(alive("a", 100), alive("b", 50)), None), None, {"b": "a"}),
                 id="no quorum yet: the ready replicas up to date are the sources"),
    pytest.param(Sources(Row(quorum("a"), table(alive("a"), alive("b", 50), alive("c", 50)), None),
                         ("a", "b"), {"c": "a"}), id="an admitted replica is no longer behind"),
]


@pytest.mark.parametrize("case", CATCH_UP)
def test_rule_7_catch_up_sources(case: Sources):
    s = case.row.situation()
    members = new_members(s, case.members) if case.members is not None else None
    got = catch_up_sources(s, members)
    assert {k: v.replica_id for k, v in got.items()} == case.expect


@pytest.mark.parametrize("case, alive_ids, staying, leaving, ready, pending", [
    pytest.param(Row(quorum("a", "b", "c"), table(alive("a"), alive("b", drain_requested=True), silent("c"),
                                                  alive("d"), alive("e", 50)), None),
                 ("a", "b", "d", "e"), ("a",), ("b", "c"), ("d",), ("e",), id="members and outsiders sorted"),
    pytest.param(Row(quorum("a", "b"), table(alive("a"), awaited("b", started=1), alive("c")), None),
                 ("a", "b", "c"), ("a", "b"), (), (), ("c",),
                 id="a member not back since the start: alive, and nobody vouched ready by a step"),
    pytest.param(Row(None, table(alive("a", 100), alive("b", 40), alive("c", 100, catching_up=True)), None,
                     committed=40), ("a", "b", "c"), (), (), ("a",), ("b", "c"),
                 id="no member: a step vouches at the holders' head only"),
])
def test_rule_1_and_the_sorting_the_rules_read(case: Row, alive_ids, staying, leaving, ready, pending):
    s = case.situation()
    assert (tuple(sorted(s.alive)), tuple(s.staying), tuple(s.leaving), tuple(s.ready), tuple(s.pending)) == (
        alive_ids, staying, leaving, ready, pending)


def test_decide_tries_the_rules_in_order():
    assert [r.__name__ for r in ORDER] == ["regroup_members", "fast_path", "split_brain_members", "member_leases",
                                           "state_lost", "restore_first_quorum", "too_few", "shrink",
                                           "split_brain_first", "grow"]


@pytest.mark.parametrize("case", [*FAST_PATH, *SHRINK, *GROW, *STATE_LOST, *RESTORE])
def test_decide_answers_with_the_first_rule_that_applies(case: Row):
    s = case.situation()
    first = next(d for r in ORDER if (d := r(s)) is not None)
    assert decide(case.prev, case.views, case.now, case.rules, case.prev_catch_up, case.committed, case.regroup,
                  case.restoring) == first
