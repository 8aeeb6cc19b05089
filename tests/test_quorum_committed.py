"""The quorum decision's rule 8, the committed state: no quorum of replicas
behind the job's committed step, table-driven and as a property."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fthsdp.coordinator.decisions.liveness import lost_at
from fthsdp.coordinator.decisions.quorum import decide, holds_state
from tests.harness.quorum_cases import NOW, RULES, Case, alive, check, quorum, silent, table

CASES = [
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
    check(case)


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
