"""Which rows each replica writes: every row once, shares balanced, the same on every replica."""

from __future__ import annotations

import random

import pytest

from fthsdp.agent.training.checkpoint.split import Item, Piece, split


@pytest.mark.parametrize(
    "items, shares, expected",
    [
        # One share takes everything.
        ([Item("b", 4, 8), Item("a", 2, 8)], 1, [[Piece("a", 0, 2), Piece("b", 0, 4)]]),
        # Whole tensors when the cuts fall between them (by name, not by the order given).
        ([Item("c", 5, 8), Item("a", 10, 4), Item("b", 1, 40)], 3,
         [[Piece("a", 0, 10)], [Piece("b", 0, 1)], [Piece("c", 0, 5)]]),
        # One tensor cut by rows.
        ([Item("w", 10, 4)], 4, [[Piece("w", 0, 2)], [Piece("w", 2, 5)], [Piece("w", 5, 8)], [Piece("w", 8, 10)]]),
        # A 0-d tensor (one row) cannot be cut: the share whose cut is nearest takes it.
        ([Item("a", 1, 400), Item("b", 1, 4)], 2, [[Piece("a", 0, 1)], [Piece("b", 0, 1)]]),
        # More shares than rows: some write nothing.
        ([Item("w", 2, 8)], 4, [[], [Piece("w", 0, 1)], [Piece("w", 1, 2)], []]),
        # An empty tensor is still written (by share 0), so the checkpoint has it.
        ([Item("e", 0, 8), Item("w", 2, 8)], 2, [[Piece("e", 0, 0), Piece("w", 0, 1)], [Piece("w", 1, 2)]]),
    ],
)
def test_split_table(items, shares, expected):
    assert split(items, shares) == expected


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one share"):
        split([Item("a", 1, 1)], 0)
    with pytest.raises(ValueError, match="same name"):
        split([Item("a", 1, 1), Item("a", 2, 1)], 2)


@pytest.mark.parametrize("seed", range(20))
def test_every_row_once_and_shares_balanced(seed):
    rng = random.Random(seed)
    items = [Item(f"t{i}", rng.choice([0, 1, rng.randint(1, 5000)]), rng.choice([2, 4, 8, 4096]))
             for i in range(rng.randint(1, 40))]
    shares = rng.randint(1, 9)
    out = split(items, shares)
    assert out == split(list(reversed(items)), shares)  # each replica computes the same split alone
    rows: dict[str, list[tuple[int, int]]] = {}
    for share in out:
        assert len({p.name for p in share}) == len(share)  # a tensor at most once per share
        for p in share:
            rows.setdefault(p.name, []).append((p.start, p.stop))
    for item in items:
        ranges = sorted(rows[item.name])
        assert ranges[0][0] == 0 and ranges[-1][1] == item.rows
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    size = {item.name: item for item in items}
    loads = [sum((p.stop - p.start) * size[p.name].row_bytes for p in share) for share in out]
    total = sum(item.nbytes for item in items)
    biggest_row = max(item.row_bytes for item in items)
    # Each share is within one row (on each side of it) of an equal part.
    assert all(abs(load - total / shares) <= biggest_row for load in loads), (loads, total / shares)
