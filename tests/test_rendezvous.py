"""The rendezvous of a replica group's hosts (fthsdp/coordinator/hosts/rendezvous.py),
table-driven: the clock is passed in, every decision says why."""

from __future__ import annotations

import dataclasses
import re

import pytest

from fthsdp.coordinator.hosts.rendezvous import (
    Action,
    Host,
    JoinRefused,
    RendezvousRules,
    Round,
    assign_ranks,
    check_join,
    decide,
    leading_shape,
)

RULES = RendezvousRules(spare_wait=10.0, rendezvous_timeout=60.0)


def host(host_id: str, group: str = "r1", joined: int = 0, lost_since: float | None = None, failed: int = 0,
         nproc: int = 1, nnodes: int = 2) -> Host:
    return Host(host_id, group, nnodes, nproc, joined_round=joined, store=f"{host_id}:7000",
                lost_since=lost_since, failed_round=failed)


def hosts(*hs: Host) -> dict[str, Host]:
    return {h.host_id: h for h in hs}


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    current: Round
    hosts: dict[str, Host]
    previous: tuple[str, ...]
    now: float
    action: Action
    says: str
    ranks: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    next_round: int = 0


CASES = [
    Case("one host of two joined: it waits for the other",
         Round(1, 0.0), hosts(host("a", joined=1), host("b")), (), 5.0,
         Action.WAIT, "round 1: 1 of 2 hosts joined; waiting for host b not joined yet"),
    Case("nobody else known yet",
         Round(1, 0.0), hosts(host("a", joined=1)), (), 5.0,
         Action.WAIT, "waiting for 1 more host (none known)"),
    Case("both joined: ranks by host id, the store is rank 0's",
         Round(1, 0.0), hosts(host("b", joined=1), host("a", joined=1)), (), 5.0,
         Action.COMPLETE, "round 1 complete: node rank 0 a, node rank 1 b; the store at a:7000", ("a", "b")),
    Case("a host keeps its rank from the round before",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", joined=2)), ("b", "a"), 5.0,
         Action.COMPLETE, "node rank 0 b, node rank 1 a; the store at b:7000", ("b", "a")),
    Case("a host that joined an earlier round does not count",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", joined=1)), ("a", "b"), 5.0,
         Action.WAIT, "1 of 2 hosts joined; waiting for node rank 1: host b not joined yet"),
    Case("a lost host waits for spare_wait before a spare takes its rank",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", lost_since=1.0), host("s", group="")), ("a", "b"), 5.0,
         Action.WAIT, "waiting for node rank 1: host b lost 4s ago, a spare takes its place in 6s"),
    Case("past spare_wait a spare is adopted",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", lost_since=1.0), host("s", group="")), ("a", "b"), 11.0,
         Action.ADOPT_SPARES, "round 2: spare s takes the place of lost b", adopted=("s",), replaced=("b",)),
    Case("each spare takes one lost host's place past its wait, both in host-id order",
         Round(2, 0.0), hosts(host("a", lost_since=1.0), host("b", lost_since=2.0), host("t", group=""),
                              host("s", group="")), ("a", "b"), 12.0,
         Action.ADOPT_SPARES, "round 2: spare s, t takes the place of lost a, b", adopted=("s", "t"),
         replaced=("a", "b")),
    Case("a host lost within the wait keeps its place: no spare for it yet",
         Round(2, 0.0), hosts(host("a", lost_since=1.0), host("b", lost_since=5.0), host("t", group=""),
                              host("s", group="")), ("a", "b"), 12.0,
         Action.ADOPT_SPARES, "round 2: spare s takes the place of lost a", adopted=("s",), replaced=("a",)),
    Case("a spare with another --nproc does not fit",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", lost_since=1.0), host("s", group="", nproc=8)),
         ("a", "b"), 11.0, Action.WAIT, "node rank 1: host b lost 10s ago, no spare"),
    Case("a spare for groups of another --nnodes does not fit",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", lost_since=1.0), host("s", group="", nnodes=4)),
         ("a", "b"), 11.0, Action.WAIT, "no spare"),
    Case("a lost spare is no spare",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", lost_since=1.0), host("s", group="", lost_since=2.0)),
         ("a", "b"), 11.0, Action.WAIT, "no spare"),
    Case("the adopted spare joined: it takes the lost host's rank",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", lost_since=1.0), host("s", joined=2)), ("a", "b"), 12.0,
         Action.COMPLETE, "node rank 0 a, node rank 1 s; the store at a:7000", ("a", "s")),
    Case("rank 0's host lost: the spare hosts the store",
         Round(2, 0.0), hosts(host("a", lost_since=1.0), host("b", joined=2), host("s", joined=2)), ("a", "b"), 12.0,
         Action.COMPLETE, "node rank 0 s, node rank 1 b; the store at s:7000", ("s", "b")),
    Case("no spare within rendezvous_timeout: the agents give up, saying why",
         Round(2, 0.0), hosts(host("a", joined=2), host("b", lost_since=1.0)), ("a", "b"), 60.0,
         Action.GIVE_UP, "round 2 did not complete in 60s: waiting for node rank 1: host b lost 59s ago, no spare"),
    Case("a running round goes on",
         Round(3, 0.0, ("a", "b"), "a:7000"), hosts(host("a", joined=3), host("b", joined=3)), ("a", "b"), 5.0,
         Action.STEADY, "round 3 runs"),
    Case("a host that reported a failure ends the round for all",
         Round(3, 0.0, ("a", "b"), "a:7000"), hosts(host("a", joined=3), host("b", joined=3, failed=3)), ("a", "b"),
         5.0, Action.END, "round 3 ended: node rank 1 (b): it reported a failure; round 4 gathers", next_round=4),
    Case("a failure reported in an earlier round does not end this one",
         Round(3, 0.0, ("a", "b"), "a:7000"), hosts(host("a", joined=3), host("b", joined=3, failed=2)), ("a", "b"),
         5.0, Action.STEADY, "round 3 runs"),
    Case("a host whose heartbeats stopped ends the round",
         Round(3, 0.0, ("a", "b"), "a:7000"), hosts(host("a", joined=3, lost_since=4.0), host("b", joined=3)),
         ("a", "b"), 5.0, Action.END, "node rank 0 (a): host lost 1s ago", next_round=4),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case):
    decision = decide("r1", 2, case.current, case.previous, case.hosts, case.now, RULES)
    assert decision.action is case.action, decision.reason
    assert case.says in decision.reason, decision.reason
    if case.action is Action.COMPLETE:
        assert decision.round.ranks == case.ranks
        assert decision.round.store == case.hosts[case.ranks[0]].store
    assert (decision.adopted, decision.replaced) == (case.adopted, case.replaced)
    if case.next_round:
        assert decision.round == Round(case.next_round, case.now), "the next round gathers from now"
    else:
        assert decision.round.number == case.current.number


def test_other_groups_and_spares_never_fill_a_round():
    decision = decide("r1", 2, Round(1, 0.0), (), hosts(host("a", joined=1), host("x", group="r2", joined=1),
                                                         host("s", group="", joined=1)), 1.0, RULES)
    assert decision.action is Action.WAIT


@pytest.mark.parametrize("joined, previous, ranks", [
    (["a", "b", "c"], (), ("a", "b", "c")),
    (["a", "b", "c"], ("c", "b", "a"), ("c", "b", "a")),
    (["a", "c", "s"], ("a", "b", "c"), ("a", "s", "c")),  # the newcomer takes the free rank
    (["s", "t", "c"], ("a", "b", "c"), ("s", "t", "c")),
])
def test_ranks_are_kept_and_the_free_ones_filled_in_host_order(joined, previous, ranks):
    assert assign_ranks(joined, previous, 3) == ranks


@pytest.mark.parametrize("joining, members, says", [
    (host("b", nnodes=3), [host("a")],
     "host b: --nnodes 3, but group r1 runs with --nnodes 2 (since its round 1 completed): give every host of a "
     "group the same --nnodes and --nproc"),
    (host("b", nproc=4), [host("a")], "host b: --nproc 4, but group r1 runs with --nproc 1 (since its round 1"),
    (host("b", nnodes=3, nproc=4), [host("a")], "--nnodes 3, but group r1 runs with --nnodes 2; --nproc 4, but "
                                                "group r1 runs with --nproc 1"),
    (host("c"), [host("a"), host("b")], "host c: group r1 already has its 2 hosts (a, b)"),
])
def test_a_join_that_would_form_the_group_wrong_is_refused_in_one_line(joining, members, says):
    """Once a round completed (fixed_in 1), the group's shape is its: another is refused naming both values."""
    with pytest.raises(JoinRefused, match=re.escape(says)):
        check_join(joining, (2, 1), members, Round(1, 0.0), fixed_in=1)


def test_a_join_that_fits_is_taken():
    check_join(host("b"), (2, 1), [host("a")], Round(1, 0.0), fixed_in=1)
    check_join(host("c"), (2, 1), [host("a"), host("b", lost_since=3.0)], Round(1, 0.0), fixed_in=1)  # a lost place


def test_before_a_round_completed_hosts_of_another_shape_gather_beside_the_first():
    """The first host's flags are not the group's for good: a host that disagrees is not refused (yet)."""
    check_join(host("b", nnodes=3), (2, 1), [host("a")], Round(1, 0.0), fixed_in=0)
    # Two of shape 2 and one of shape 3: the one of shape 3 does not count towards the others' two.
    check_join(host("c"), (2, 1), [host("a"), host("x", nnodes=3)], Round(1, 0.0), fixed_in=0)


@pytest.mark.parametrize("members, shape", [
    ([host("a")], (2, 1)),
    ([host("a", nnodes=3), host("b"), host("c")], (2, 1)),  # most hosts said it
    ([host("a", nnodes=3), host("b")], (3, 1)),  # a tie: the lowest host id's
    ([host("a", nnodes=3), host("b"), host("c", lost_since=1.0)], (3, 1)),  # a lost host says nothing
    ([host("a", nnodes=3), host("b", joined=1), host("c", joined=1), host("d", nnodes=3), host("e", nnodes=3)],
     (2, 1)),  # two of shape 2 joined round 1: they fill it, it completes with their shape
    ([host("a", nnodes=3, joined=1), host("b", nnodes=3, joined=1)], (3, 1)),  # 2 of 3 joined: the most said it
    ([host("a", lost_since=0.0)], None),
])
def test_the_shape_a_group_is_decided_with_before_its_first_round_completed(members, shape):
    assert leading_shape(members, 1) == shape


def test_a_host_of_the_last_round_keeps_its_rank_when_more_joined_than_the_round_takes():
    """A host came back beside the one that took its place: the round's hosts keep theirs (never pushed out)."""
    decision = decide("r1", 2, Round(2, 0.0), ("a", "s"), hosts(host("a", joined=2), host("b", joined=2),
                                                                 host("s", joined=2)), 1.0, RULES)
    assert decision.action is Action.COMPLETE and decision.round.ranks == ("a", "s"), decision.reason
