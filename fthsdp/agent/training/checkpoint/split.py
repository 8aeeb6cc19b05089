"""Which part of a checkpoint each replica writes: a pure, deterministic split.

Every replica of a quorum holds the same state, so each can compute the
whole split alone and write only its share: the checkpoint's bytes, in the
order of the items' names, cut into ``shares`` runs of nearly equal size.
A tensor that straddles a cut is divided between rows (its first
dimension), so the shares differ by at most about one row of one tensor;
a 0-d tensor is one row. No share is ever empty of work while another
holds two whole tensors' worth: the cut is by bytes, not by items.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One tensor of the state, as the split sees it."""

    name: str
    rows: int
    """The size of its first dimension (1 for a 0-d tensor)."""
    row_bytes: int
    """Bytes per row (the whole tensor for a 0-d one)."""

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class Piece:
    """Rows ``start`` to ``stop`` (exclusive) of item ``name``."""

    name: str
    start: int
    stop: int


def split(items: list[Item], shares: int) -> list[list[Piece]]:
    """The pieces of each of ``shares`` shares, in order. Every row of every
    item is in exactly one share; share ``i`` starts at the row nearest to
    byte ``i * total / shares`` of the items laid end to end by name."""
    if shares < 1:
        raise ValueError(f"a checkpoint is split into at least one share, not {shares}")
    ordered = sorted(items, key=lambda item: item.name)
    if len({item.name for item in ordered}) != len(ordered):
        raise ValueError("two items of the state have the same name")
    total = sum(item.nbytes for item in ordered)
    out: list[list[Piece]] = [[] for _ in range(shares)]
    offset = 0  # bytes before the current item
    for item in ordered:
        if item.rows == 0:
            out[0].append(Piece(item.name, 0, 0))  # an empty tensor is still part of the state
            continue
        # The cuts that fall inside this item, as row numbers, nearest row first.
        row = 0
        for share in range(shares):
            end = _cut_row(item, offset, total, share + 1, shares)
            if end > row:
                out[share].append(Piece(item.name, row, end))
                row = end
        offset += item.nbytes
    return out


def _cut_row(item: Item, offset: int, total: int, cut: int, shares: int) -> int:
    """The row of ``item`` where share ``cut`` begins (0..rows), ``offset`` its first byte."""
    if cut >= shares:
        return item.rows  # the last share takes everything left
    position = cut * total / shares - offset  # the cut, in bytes into this item
    if item.row_bytes == 0:
        return item.rows if position > 0 else 0
    return min(item.rows, max(0, round(position / item.row_bytes)))
