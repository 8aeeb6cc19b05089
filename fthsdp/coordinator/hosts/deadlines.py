"""Deadlines of the host table (fthsdp/coordinator/hosts/table.py), so that a
tick looks only at what fell due (issue 49).

Each kind of deadline is a wait that began at some time and lasts a
duration: a host's silence (since it was last heard; the heartbeat
timeout), a lost host's place (since it was lost; the spare wait), a
gathering round (since it opened; its rendezvous timeout), a group learned
after a restart (since its first hello; the heartbeat timeout). ``Due``
keeps the entries of one kind ordered by when their wait began, and is
asked with the duration at the time of asking: the heartbeat timeout a
tick passes is the configured one plus the event loop's lag, which changes
from tick to tick, and a wait ordered by its start is due in the same order
whatever the duration, so that a shorter timeout than before is honoured at
once, and a longer one too, with no entry to move. Nothing due costs one
comparison.

Entries are not removed when what they wait for changes (a heartbeat, a
host back, a round that completed): the owner checks an entry against what
it stands for when it falls due, then drops it or adds it again from its
new start.
"""

from __future__ import annotations

import heapq
import itertools
from typing import NamedTuple


class Entry(NamedTuple):
    since: float
    """When the wait began."""
    key: str
    """What waits: a host id or a group's name."""
    token: object
    """What the wait was for, for the owner to check it still stands (a stream, a round's number)."""


class Due:
    """One kind of deadline: each entry falls due once ``now - since`` passes
    the duration (``strict``: exceeds it; else reaches it), as the rule the
    kind stands for compares."""

    def __init__(self, strict: bool) -> None:
        self._strict = strict
        self._heap: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()  # entries of one start are taken in the order they came

    def add(self, since: float, key: str, token: object = None) -> None:
        heapq.heappush(self._heap, (since, next(self._order), key, token))

    def pop(self, now: float, duration: float) -> Entry | None:
        """The earliest entry if it is due (taken out), else None. The same
        subtraction as the rule's, so that an entry falls due exactly when
        the rule says; ``now - since`` only shrinks as ``since`` grows, so
        the first entry alone says whether any is."""
        if not self._heap:
            return None
        elapsed = now - self._heap[0][0]
        if elapsed > duration or (not self._strict and elapsed >= duration):
            since, _, key, token = heapq.heappop(self._heap)
            return Entry(since, key, token)
        return None

    def __len__(self) -> int:
        return len(self._heap)
