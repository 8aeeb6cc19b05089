"""FTAR's agreement as a pure function: after every agree, every member's
next collective must be the same (or a member waits forever for a collective
nobody else starts). Checked exhaustively over small configurations."""

from __future__ import annotations

import itertools

import pytest

from fthsdp.agent.training.ftar.decisions import (
    AGAIN,
    FOLLOW_HEAL,
    FOLLOW_HELD,
    IN_PHASE,
    JOIN_IN_PHASE,
    NO_GRADIENT,
    REPLAY_TO_BEFORE_HEAD,
    SERVE_LAST,
    TAKE_HELD,
    TAKE_LAST,
    FtarError,
    agree_action,
)

H = 100  # the members' step


def row(step: int, contributes: bool, holds_last: bool, holds_this: bool = False) -> list[int]:
    """``holds_last``: the committed sum of step - 1; ``holds_this``: the
    complete sum of ``step``, undecided (its vote was abandoned)."""
    return [step, 10, 7, 2 if holds_last else 0, 5 if holds_last else 0, int(contributes), 0,
            6 if holds_this else 0, 3 if holds_this else 0]


def collective(action: str, arg: int, rows: list[list[int]]) -> tuple:
    if action in (AGAIN, REPLAY_TO_BEFORE_HEAD):
        return ("allgather",)
    if action == IN_PHASE:
        return ("allreduce", arg)
    if action == JOIN_IN_PHASE:  # the joiner counts the contributors itself
        return ("allreduce", sum(1 for r in rows if r[5]))
    if action in (TAKE_HELD, FOLLOW_HELD):
        return ("broadcast, then a vote", arg)
    assert action in (FOLLOW_HEAL, TAKE_LAST, SERVE_LAST)
    return ("broadcast", arg)


def next_collectives(rows: list[list[int]]) -> list[tuple]:
    return [collective(*agree_action(r[0], bool(r[5]), rows), rows) for r in rows]


def scenarios():
    """Members with a gradient at H, or split between H and H + 1 by a
    failure (those at H + 1 hold the sum of H; those at H hold H - 1's), plus
    joiners without a gradient, holding no sum, anywhere from H - 3 to the top."""
    for n_members, n_joiners in ((1, 1), (2, 1), (2, 2), (3, 1), (1, 2)):
        for ahead in range(n_members):
            top = H + 1 if ahead else H
            # Those at H may hold H's sum undecided (a vote abandoned): all of
            # them when a member ahead committed it, any of them otherwise.
            holdings = [(True,) * (n_members - ahead)] if ahead else itertools.product(
                (False, True), repeat=n_members)
            for holds in holdings:
                members = [row(H + 1, True, True)] * ahead + [row(H, True, True, h) for h in holds]
                for joiner_steps in itertools.product(range(H - 3, top + 1), repeat=n_joiners):
                    rows = members + [row(s, False, False) for s in joiner_steps]
                    yield pytest.param(rows, id=f"members{[r[0] - H for r in members]}-held{[int(h) for h in holds]}"
                                                f"-joiners{[s - H for s in joiner_steps]}")


@pytest.mark.parametrize("rows", list(scenarios()))
def test_every_member_starts_the_same_next_collective(rows):
    kinds = next_collectives(rows)
    assert len(set(kinds)) == 1, list(zip([r[0] - H for r in rows], kinds, strict=False))


def test_in_phase_counts_only_members_with_a_gradient():
    rows = [row(H, True, True), row(H, True, True), row(H, False, False)]
    assert agree_action(H, True, rows) == (IN_PHASE, 2)
    assert agree_action(H, False, rows) == (JOIN_IN_PHASE, H)  # sets the members' hyperparameters


def test_a_joiner_behind_joins_the_members_all_reduce_at_once():
    """The members do not wait for the joiner's replay: it runs during their all-reduce."""
    rows = [row(H, True, True), row(H, True, True), row(H - 3, False, False)]
    assert agree_action(H - 3, False, rows) == (JOIN_IN_PHASE, H)
    assert agree_action(H, True, rows) == (IN_PHASE, 2)


def test_a_joiner_ahead_of_the_members_is_an_error_and_the_others_agree_again():
    rows = [row(H, True, True), row(H + 1, False, False), row(H - 1, False, False)]
    with pytest.raises(FtarError, match="ahead"):
        agree_action(H + 1, False, rows)
    assert agree_action(H, True, rows) == (AGAIN, 0)
    assert agree_action(H - 1, False, rows) == (AGAIN, 0)


def test_a_survivor_one_step_behind_takes_the_sum_from_a_holder():
    rows = [row(H, True, True), row(H + 1, True, False), row(H + 1, True, True)]
    assert agree_action(H, True, rows) == (TAKE_LAST, 2)  # the replica at H + 1 without the sum is no root
    assert agree_action(H + 1, True, rows) == (SERVE_LAST, 2)


@pytest.mark.parametrize("steps", [(H, H), (H, H - 1), (H - 2,)])
def test_nobody_with_a_gradient_commits_nothing(steps):
    """Joiners whose members were all lost as they were admitted: none of
    them has a gradient; every one returns without a collective and runs
    the step again (the loop's commit() returns False)."""
    rows = [row(s, False, False) for s in steps]
    for s in steps:
        assert agree_action(s, False, rows) == (NO_GRADIENT, 0)


def test_a_sum_some_member_holds_undecided_is_never_redone():
    """r0's vote on step H's sum was abandoned; r1 never saw the sum
    complete. A dropped member may have committed that sum (its vote
    completed), so the survivors take it from r0 and vote again, instead of
    summing step H anew between themselves (commit_vote.py)."""
    rows = [row(H, True, True, holds_this=False), row(H, True, True, holds_this=True), row(H, False, False)]
    assert agree_action(H, True, rows) == (TAKE_HELD, 1)
    assert agree_action(H, False, rows) == (FOLLOW_HELD, 1)
    rows = [row(H, True, True), row(H, True, True)]
    assert agree_action(H, True, rows) == (IN_PHASE, 2)


def test_a_member_ahead_outranks_an_undecided_sum():
    """One member committed H (its vote completed): the others, holding the
    same sum undecided, take it from that member as before."""
    rows = [row(H + 1, True, True), row(H, True, True, holds_this=True)]
    assert agree_action(H, True, rows) == (TAKE_LAST, 0)
    assert agree_action(H + 1, True, rows) == (SERVE_LAST, 0)


def test_a_joiners_undecided_sum_is_not_used():
    """A joiner's sum holds no gradient of its own; the members redo or take theirs."""
    rows = [row(H, True, True), row(H, False, False, holds_this=True)]
    assert agree_action(H, True, rows) == (IN_PHASE, 1)
    assert agree_action(H, False, rows) == (JOIN_IN_PHASE, H)


def test_members_steps_too_far_apart_is_an_error():
    rows = [row(H, True, True), row(H + 1, True, True), row(H + 2, True, True)]
    with pytest.raises(FtarError, match="steps"):
        agree_action(H + 1, True, rows)


# ----- the agreed switch to a quorum that only grows the group ---------------------------


@pytest.mark.parametrize(
    "proposals, expected",
    [
        ([2, 2, 2], 12),  # every member proposes quorum 10 + 2
        ([1], 11),
        ([0, 0, 0], 0),  # nothing to switch to
        ([2, 2, 0], 0),  # one member has not built the group yet
        ([1, 2, 3], 0),  # the sums alone would say "all 2": the squares tell them apart
        ([3, 1, 2, 2], 0),
        ([15] * 1000, 25),
    ],
)
def test_members_switch_only_when_every_proposal_is_the_same(proposals, expected):
    import torch

    from fthsdp.agent.training.ftar.decisions import slot_switch

    # Summed in float32, as in the gradient all-reduce.
    total = torch.tensor([float(d) for d in proposals], dtype=torch.float32).sum()
    squares = torch.tensor([float(d * d) for d in proposals], dtype=torch.float32).sum()
    assert slot_switch(10, len(proposals), int(total), int(squares)) == expected


# ----- is_growth: what the coordinator's last_drop_id lets a member conclude ------------

def test_is_growth_from_last_drop_id() -> None:
    from fthsdp.agent.training.ftar.decisions import is_growth
    from fthsdp.protos.v1 import coordinator_pb2 as pb

    q = lambda qid, last_drop: pb.Quorum(id=qid, last_drop_id=last_drop)  # noqa: E731
    assert is_growth(4, q(6, 3))  # nobody dropped since 3: 5 and 6 only added
    assert is_growth(4, q(6, 4))
    assert not is_growth(4, q(6, 5))  # quorum 5 dropped someone
    assert not is_growth(6, q(6, 1))  # the group's own quorum
    assert not is_growth(4, q(6, 0))  # unknown: not vouched for
    assert not is_growth(4, None)


def test_is_growth_agrees_with_the_member_lists_along_random_chains() -> None:
    """Along random membership changes published as the coordinator does,
    is_growth(g, n) holds exactly when every quorum after g kept all of its
    predecessor's incarnations: never for a quorum that lost a member of g
    (a drop and re-admission in between is conservatively not growth)."""
    import random

    from fthsdp.agent.training.ftar.decisions import is_growth
    from fthsdp.coordinator.decisions.quorum_types import Member, Quorum, next_last_drop_id
    from fthsdp.coordinator.ledger.codec import quorum_to_pb

    rng = random.Random(7)
    for _ in range(50):
        chain: list[Quorum] = []
        members: dict[str, Member] = {}
        for qid in range(1, 25):
            for rid in [r for r in members if rng.random() < 0.15]:
                del members[rid]  # failed, left or (re-added below) restarted
            for i in rng.sample(range(8), rng.randint(0, 2)):
                members.setdefault(f"r{i}", Member(f"r{i}", "h:1", 1, 0, qid))
            ordered = tuple(members[r] for r in sorted(members))
            prev = chain[-1] if chain else None
            chain.append(Quorum(qid, ordered, last_drop_id=next_last_drop_id(prev, qid, ordered)))
        for g in chain:
            for n in chain:
                if n.id <= g.id:
                    continue
                kept = set(g.members) <= set(n.members) and all(
                    set(chain[i - 1].members) <= set(chain[i].members) for i in range(g.id, n.id))
                assert is_growth(g.id, quorum_to_pb(n)) == kept, (g, n)
