"""The one writer of a job's keys: a change of the ledger, as one store transaction.

``commit(before, after)`` turns the difference between two ledgers
(fthsdp/coordinator/ledger/value.py) into one transaction: each key that
changed is written (or deleted) only if it is still at the revision this
coordinator last saw, and only while this coordinator still holds the
leader's key (``guard``): a coordinator that lost its leadership between
deciding and persisting writes nothing. Nothing else in the coordinator
writes a job's keys. ``LedgerWriter.update`` runs one change at a time, each
computed from the ledger as stored (persisted before it is applied, as etcd
raft's ``Ready``/``Advance``); when another writer moved a key on, the
writer adopts what the store holds and raises ``LedgerConflict`` for the
caller to decide again from it.

Store calls are blocking (etcd client) and go to a worker thread, so an
unreachable etcd delays a change but never the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.ledger.value import Ledger, decode_items, encode
from fthsdp.coordinator.store import Store
from fthsdp.core.errors import LostOwnership

Guard = Callable[[], "tuple[str, int] | None"]
"""The leader's key and the revision this coordinator holds it at (None: no election, a lone coordinator)."""


def no_guard() -> tuple[str, int] | None:
    return None


class LedgerConflict(LostOwnership):
    """Another writer moved a key of the change on: the writer now holds what the store does."""

    def __init__(self, message: str, keys: frozenset[str]) -> None:
        super().__init__(message)
        self.keys = keys
        """The keys that another writer had moved on."""


class NotLeading(LostOwnership):
    """This coordinator no longer holds the leader's key: it wrote nothing."""


@dataclasses.dataclass(frozen=True)
class Change:
    """What one commit writes: the compared revisions, the puts and the deletes."""

    compares: dict[str, int]
    puts: dict[str, bytes]
    deletes: list[str]

    @property
    def empty(self) -> bool:
        return not self.puts and not self.deletes


def diff(before: Ledger, after: Ledger, keys: JobKeys, revisions: dict[str, int]) -> Change:
    """The transaction that takes the store from ``before`` to ``after``
    (``revisions``: each key's as last seen). Parts that are the same object
    are not encoded (a registration changes one record of thousands)."""
    old, new = _parts(before, after, keys), _parts(after, before, keys)
    puts = {k: v for k, v in new.items() if old.get(k) != v}
    deletes = [k for k in old if k not in new]
    compares = {k: revisions.get(k, 0) for k in (*puts, *deletes)}
    return Change(compares, puts, deletes)


def _parts(ledger: Ledger, other: Ledger, keys: JobKeys) -> dict[str, bytes]:
    """The keys of ``ledger`` whose part is not the very object ``other`` holds."""
    same_records = ledger.records is other.records
    trimmed = dataclasses.replace(
        ledger,
        epoch=None if ledger.epoch is other.epoch else ledger.epoch,
        quorum=None if ledger.quorum is other.quorum else ledger.quorum,
        committed=None if ledger.committed is other.committed else ledger.committed,
        checkpoints=() if ledger.checkpoints is other.checkpoints else ledger.checkpoints,
        records={} if same_records else {r: rec for r, rec in ledger.records.items()
                                          if other.records.get(r) is not rec},
    )
    return encode(trimmed, keys)


class LedgerWriter:
    """Holds a job's ledger as stored and is the only one to change it."""

    def __init__(self, store: Store, keys: JobKeys, guard: Guard = no_guard) -> None:
        self.store = store
        self.keys = keys
        self.guard = guard
        self.current = Ledger()
        """The ledger as last read or written."""
        self.revisions: dict[str, int] = {}
        """Each key's revision as last read or written (absent: 0)."""
        self.lock = asyncio.Lock()
        """One change at a time, each from the ledger as stored."""

    def load(self) -> Ledger:
        """Read the job's keys as one snapshot (blocking: call in a thread)."""
        items = self.store.get_prefix(self.keys.root)
        self.current = decode_items(items, self.keys)
        self.revisions = {k: v.revision for k, v in items.items()}
        return self.current

    async def update(self, change: Callable[[Ledger], Ledger]) -> Ledger:
        """Store ``change(current)`` and hold it; returns it. Raises
        LedgerConflict (the store's values adopted), NotLeading, or the
        store's StoreError (nothing is known to have changed)."""
        async with self.lock:
            before = self.current
            after = change(before)
            if after is before:
                return before
            await asyncio.to_thread(self.commit, before, after)
            return after

    def commit(self, before: Ledger, after: Ledger) -> None:
        """One transaction from ``before`` (the ledger held) to ``after`` (blocking)."""
        change = diff(before, after, self.keys, self.revisions)
        if change.empty:
            self.current = after
            return
        compares = dict(change.compares)
        held = self.guard()
        if held is not None:
            compares[held[0]] = held[1]
        result = self.store.transact(compares, change.puts, change.deletes)
        if result.succeeded:
            self.revisions.update(result.revisions)
            for key in change.deletes:
                self.revisions.pop(key, None)
            self.current = after
            return
        now = {k: (v.revision if v is not None else 0) for k, v in result.current.items()}
        if held is not None and now.get(held[0]) != held[1]:
            raise NotLeading(f"job {self.keys.job}: this coordinator no longer leads; nothing was written")
        moved = frozenset(k for k, revision in change.compares.items() if now.get(k, 0) != revision)
        theirs = {k: result.current.get(k) for k in moved}
        self.current = decode_items(theirs, self.keys, self.current)
        for key, item in theirs.items():
            if item is None:
                self.revisions.pop(key, None)
            else:
                self.revisions[key] = item.revision
        raise LedgerConflict(f"job {self.keys.job}: {', '.join(sorted(k.removeprefix(self.keys.root) for k in moved))}"
                             f" changed under this coordinator", moved)
