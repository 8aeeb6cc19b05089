"""What a host's hello may claim (fthsdp/coordinator/hosts/claims.py), table-driven:
its host id against the open stream's incarnation, its round against the
group's, and its node ranks against the group's roster."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.coordinator.hosts.claims import (
    NO_VERSION,
    Claim,
    Roster,
    claims,
    decided,
    displaced,
    identity_refusal,
    merge,
    round_refusal,
)


@dataclasses.dataclass(frozen=True)
class MergeCase:
    name: str
    roster: Roster
    claimed: list[Claim]
    hosts: tuple[str, ...]
    out: list[tuple[str, str, int]]


R1 = decided(("a", "b"), 1)
"""Round 1 completed with a at node rank 0, b at 1."""

MERGES = [
    MergeCase("an empty roster takes every claim", Roster().sized(2), claims("a", ("a", "b"), 3, 3, 0),
              ("a", "b"), []),
    MergeCase("a spare adopted in a later round takes the rank of the host it replaced",
              R1, claims("s", ("a", "s"), 2, 2, -1), ("a", "s"), [("b", "s", 1)]),
    MergeCase("an older roster changes nothing", decided(("a", "s"), 2), claims("b", ("a", "b"), 1, 1, 1),
              ("a", "s"), []),
    MergeCase("in one round a host's word about itself beats another's roster",
              Roster(("a", "b"), ((2, False), (2, False))), claims("s", ("a", "s"), 2, 2, -1), ("a", "s"),
              [("b", "s", 1)]),
    MergeCase("the same claim again changes nothing", R1, claims("b", ("a", "b"), 1, 1, 1), ("a", "b"), []),
    MergeCase("a host at a newer rank leaves its older one empty",
              Roster(("a", "b", "c"), ((1, True),) * 3), [Claim(2, "a", (2, True))], ("", "b", "a"),
              [("c", "a", 2)]),
    MergeCase("a rank past the group's size is ignored", R1, [Claim(5, "x", (9, True))], ("a", "b"), []),
    MergeCase("without a roster, the rank a host runs", Roster().sized(2), claims("b", (), 0, 4, 1), ("", "b"), []),
]


@pytest.mark.parametrize("case", MERGES, ids=[c.name for c in MERGES])
def test_merge(case: MergeCase):
    roster, out = merge(case.roster, case.claimed)
    assert roster.hosts == case.hosts
    assert out == case.out
    assert len(roster.versions) == len(roster.hosts)


def test_a_claim_is_the_hosts_roster_or_the_rank_it_runs():
    assert claims("b", ("a", "b"), 3, 4, -1) == [Claim(0, "a", (3, False)), Claim(1, "b", (3, True))]
    assert claims("b", (), 0, 4, 1) == [Claim(1, "b", (4, True))]
    assert claims("b", (), 0, 4, -1) == [] and claims("b", (), 0, 0, 0) == []
    assert Roster(("a",), ((1, True),)).sized(3) == Roster(("a", "", ""), ((1, True), NO_VERSION, NO_VERSION))


@pytest.mark.parametrize("roster, claimed, host, got", [
    (decided(("a", "s"), 2), claims("b", ("a", "b"), 1, 1, 1), "b", (1, "s")),  # a spare took its rank later
    (decided(("a", "b"), 2), claims("b", ("a", "b"), 1, 1, 1), "b", None),  # it holds its rank
    (decided(("a", "s"), 2), claims("b", (), 0, 0, -1), "b", None),  # it claims none: a fresh agent
    (decided(("a", "s"), 2), claims("b", ("a", "b"), 3, 3, 1), "b", None),  # its claim is newer
    (Roster(("a", ""), ((2, True), NO_VERSION)), claims("b", ("a", "b"), 1, 1, 1), "b", None),  # nobody holds it
])
def test_displaced(roster, claimed, host, got):
    assert displaced(roster, claimed, host) == got


@pytest.mark.parametrize("live, incarnation, says", [
    (None, "i2", ""),  # no stream open under the host id: a restarted agent, or the first
    ("i1", "i1", ""),  # the same agent, reconnecting after its stream dropped
    ("i1", "i2", "host id 'h' is taken: another agent with this host id is connected (from 10.0.0.1, for 42s); "
                 "give each agent its own --host-id"),
    ("i1", "", "is taken"),  # no incarnation at all is no pass either
])
def test_identity_refusal(live, incarnation, says):
    why = identity_refusal("h", live, incarnation, "10.0.0.1", 42.0)
    assert (says in why) if says else why == ""


@pytest.mark.parametrize("claimed, current, ran, learning, allowed", [
    (3, 3, False, False, True),
    (1, 3, False, False, True),  # behind: the welcome tells it where the group is
    (4, 3, True, False, True),  # it ran in round 3: its failure report was lost on the way
    (4, 3, False, False, False),  # it did not run in round 3: it cannot be in round 4
    (5, 3, True, False, False),  # a round number that jumps
    (2**31 - 1, 3, True, False, False),
    (2**31 - 1, 3, False, True, True),  # the group is learned after a restart: nothing else knows its round
])
def test_round_refusal(claimed, current, ran, learning, allowed):
    why = round_refusal("h", "r1", claimed, current, ran, learning)
    assert (why == "") is allowed, why
    if not allowed:
        assert f"host h says it is in round {claimed} of group r1, which is in round {current}" in why
