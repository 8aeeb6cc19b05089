"""Probes that scale (fthsdp/coordinator/decisions/stuck.py ``probe_targets``):
above 16 members each member probes its neighbours on a ring, so the
probes grow with the members and each member is sent only its own targets;
a failed node, a cut link and a job cut in two are still found, the last
within a few rounds (each round a quorum of the members kept). Pure, on
simulated reachability.
"""

from __future__ import annotations

import random

import pytest

from fthsdp.coordinator.decisions.hang import Stuck
from fthsdp.coordinator.decisions.reach_book import ReachBook
from fthsdp.coordinator.decisions.stuck import (
    PROBE_ALL_UP_TO,
    Act,
    largest_clique,
    merge_reports,
    probe_targets,
)

NOW = 1000.0


def ids(n: int) -> list[str]:
    return [f"r{i:04d}" for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, PROBE_ALL_UP_TO])
def test_up_to_16_members_every_member_probes_every_other(n):
    members = ids(n)
    assert all(probe_targets(members, m) == tuple(members) for m in members)


@pytest.mark.parametrize("n", [PROBE_ALL_UP_TO + 1, 100, 781, 12500])
def test_above_16_each_member_probes_at_most_8_neighbours_and_every_pair_from_both_sides(n):
    members = ids(n)
    sample = members if n <= 1000 else random.Random(n).sample(members, 200)
    for m in sample:
        targets = probe_targets(members, m)
        assert m not in targets and 2 <= len(targets) <= 8 and set(targets) <= set(members)
        assert all(m in probe_targets(members, t) for t in targets)  # a cut pair is reported by both sides


def rounds(members: list[str], cut, limit: int = 10) -> tuple[list[str], int]:
    """Probe, keep the largest set with no reported cut, and again in the quorum of the kept, until a
    round finds no cut; returns the kept members and the rounds it took."""
    for r in range(1, limit + 1):
        answers = {}
        for m in members:
            targets = [t for t in probe_targets(members, m) if t != m]
            reached = frozenset(t for t in targets if not cut(m, t))
            answers[m] = {0: (reached, frozenset(targets) - reached)}
        reach, complete = merge_reports(answers, {m: 1 for m in members})
        assert complete == frozenset(members)
        keep = largest_clique(members, reach)
        if keep == sorted(members):
            return keep, r
        members = keep
    raise AssertionError(f"still cutting after {limit} rounds")


def test_a_failed_node_among_200_is_the_one_taken_out_in_one_round():
    members = ids(200)
    kept, taken = rounds(members, lambda a, b: "r0077" in (a, b))
    assert kept == [m for m in members if m != "r0077"] and taken == 2  # the second round finds nothing


def test_a_cut_link_costs_one_of_its_two_ends():
    members = ids(200)
    a, b = members[10], probe_targets(members, members[10])[0]
    kept, _ = rounds(members, lambda x, y: {x, y} == {a, b})
    assert len(kept) == 199 and (a in kept) != (b in kept)


@pytest.mark.parametrize("contiguous", [True, False], ids=["two-racks", "scattered"])
def test_a_job_cut_in_two_keeps_only_one_side_within_a_few_rounds(contiguous):
    members = ids(200)
    side = set(members[:120]) if contiguous else set(random.Random(7).sample(members, 120))
    kept, taken = rounds(members, lambda x, y: (x in side) != (y in side))
    assert set(kept) <= side or not set(kept) & side, "the kept members still span the cut"
    assert set(kept) <= side and len(kept) >= 100 and taken <= 4, (len(kept), taken)


def test_400_members_probe_through_the_book_each_sent_its_own_targets_and_the_failed_one_taken_out():
    members = ids(400)
    addresses = {m: (f"{m}:1", f"{m}:2") for m in members}
    sizes = {m: 2 for m in members}
    stuck = Stuck(step=40, rank=0, waited=12.0)
    book = ReachBook()
    assert book.look(stuck, members, 7, lambda: 40, sizes, addresses, NOW, 10.0).act is Act.REGROUP
    book.quorum_changed()
    assert book.look(stuck, members, 8, lambda: 40, sizes, addresses, NOW + 11, 10.0).act is Act.PROBE
    sent = []
    for m in members:
        request = book.probe_for(m, is_member=True)
        assert [t.replica_id for t in request.targets] == list(probe_targets(members, m))
        assert all(tuple(t.addresses) == addresses[t.replica_id] for t in request.targets)
        sent.append(request.ByteSize())
        for rank in (0, 1):  # each rank probes its own rank of its targets; r0200's data link is down
            targets = [t.replica_id for t in request.targets if t.replica_id != m]
            reached = [t for t in targets if "r0200" not in (m, t)]
            book.answer(m, rank, request.id, reached, sorted(set(targets) - set(reached)), 2)
    assert max(sent) < 8 * 40  # bytes per member bounded by the ring's degree, not by the members
    action = book.look(stuck, members, 8, lambda: 40, sizes, addresses, NOW + 12, 10.0)
    assert action.act is Act.TAKE_OUT and set(action.take_out) == {"r0200"}, action
