"""The state-store interface: a tiny versioned key-value store with
compare-and-swap, modelled on etcd.

This is the only storage abstraction the coordinator uses, so its semantics
are spelled out here and every backend must pass ``tests/test_store_contract.py``.

Keys
    Non-empty ``str``. Backends that speak bytes (etcd) encode them as UTF-8.
    The project lays keys out like paths (``/fthsdp/<job>/...``) but the store
    gives ``/`` no meaning.

Values
    Arbitrary ``bytes``; every byte value round-trips unchanged.

Revisions
    Every write (a successful set or delete) takes the next value of one
    store-wide counter, like etcd's ``mod_revision``. So a key's revision is
    ``> 0`` while it exists, changes on every write to it, never repeats for
    that key, and revisions of different writes are strictly increasing in the
    order the writes happened, across all keys. Absent keys have no revision;
    in a comparison ``0`` stands for "absent". Callers must treat revisions as
    opaque tokens to compare and pass back, not as counts of writes.

Compare-and-swap
    The only ways to write are :meth:`Store.compare_and_set` and
    :meth:`Store.compare_and_delete`. Both are atomic: the comparison and the
    write happen as one step with respect to every other client of the same
    store, which is what lets two coordinators share a store safely. A failed
    comparison is a normal result (``succeeded=False``), not an exception, and
    carries what is in the store now, so the caller can re-decide without a
    second read.

Transactions
    :meth:`Store.transact` compares the revisions of several keys and, only
    if every one matches, writes and deletes several keys, as one atomic step
    (etcd's ``Txn``). The writes of one transaction share one revision. A
    job's ledger is written this way, one transaction per change, conditioned
    on the leader's key as well (fthsdp/coordinator/ledger/writer.py).

Leases
    A lease has a time to live; a key written with it (``compare_and_set(...,
    lease=L)``) is deleted when the lease expires or is revoked, each delete a
    write with its own revision. ``refresh_lease`` restarts the time to live
    while the lease lives. This is what a leader election stands on: the
    leader's key disappears by itself when the leader stops refreshing it.
    etcd rounds a lease's time to live up to whole seconds and applies its own
    minimum; lease ids are ``> 0`` and opaque.

Errors
    A backend that cannot be reached raises
    :class:`~fthsdp.core.errors.StoreUnavailable` (chained from the client
    library's exception) with a one-line message naming the endpoints; callers
    may retry later. Any other store-side failure raises
    :class:`~fthsdp.core.errors.StoreError`. Client-library exceptions never
    escape. If a *write* raises ``StoreUnavailable`` its outcome is unknown (the
    request may have been applied before the connection broke): re-read the
    key before deciding anything.

Threads
    Every method is synchronous and safe to call from many threads at once
    (the coordinator calls them through ``asyncio.to_thread``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Versioned:
    """A value as stored, with the revision of the write that stored it."""

    value: bytes
    revision: int
    """``> 0``; the store-wide revision of the last write of this key."""


@dataclass(frozen=True)
class CasResult:
    """The outcome of a compare-and-swap.

    ``current`` is the key as it is right after the call: on success the value
    just written (``None`` after a delete); on failure whatever beat the caller
    to it (``None`` if the key is absent).
    """

    succeeded: bool
    current: Versioned | None


@dataclass(frozen=True)
class TxnResult:
    """The outcome of a transaction.

    On success ``revisions`` holds the new revision of every key written (all
    the same: one transaction is one write); on failure ``current`` holds every
    compared key as it is now (``None``: absent), so that the caller can see
    who moved what without a second read.
    """

    succeeded: bool
    revisions: dict[str, int] = field(default_factory=dict)
    current: dict[str, Versioned | None] = field(default_factory=dict)


class Store(abc.ABC):
    """A versioned key-value store with compare-and-swap; see the module docs."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """Where the data lives, for logs and error messages, e.g. ``"memory"``
        or ``"etcd://127.0.0.1:2379"``."""

    @abc.abstractmethod
    def get(self, key: str) -> Versioned | None:
        """The key's value and revision, or ``None`` if it does not exist.

        Reads are linearizable: a get that starts after a write returned sees
        that write (or a later one).
        """

    @abc.abstractmethod
    def get_prefix(self, prefix: str) -> dict[str, Versioned]:
        """Every key that starts with ``prefix``, as one consistent snapshot.

        The match is a plain string prefix: ``"/a/b"`` matches ``"/a/b"``,
        ``"/a/b/x"`` and also ``"/a/bc"``. Callers that mean a directory end
        the prefix with ``"/"``. The empty prefix matches every key.
        """

    @abc.abstractmethod
    def compare_and_set(self, key: str, value: bytes, expected_revision: int, lease: int = 0) -> CasResult:
        """Write ``value`` only if the key's current revision is ``expected_revision``.

        ``expected_revision == 0`` means "only if the key does not exist"
        (create); otherwise the key must exist with exactly that revision
        (update). On success ``current`` holds the new value and its new
        revision, which is greater than every revision issued before. With
        ``lease``, the key is deleted when that lease ends.
        """

    @abc.abstractmethod
    def transact(self, compares: Mapping[str, int], puts: Mapping[str, bytes],
                 deletes: Iterable[str] = ()) -> TxnResult:
        """Only if every key of ``compares`` is at its revision (0: absent),
        write ``puts`` and delete ``deletes``, atomically. A key may not be
        both written and deleted; deleting an absent key writes nothing."""

    @abc.abstractmethod
    def grant_lease(self, ttl: float) -> int:
        """A new lease that lives ``ttl`` seconds (at least) unless refreshed."""

    @abc.abstractmethod
    def refresh_lease(self, lease: int) -> bool:
        """Restart the lease's time to live; False if it already ended (its
        keys are gone) or never existed."""

    @abc.abstractmethod
    def revoke_lease(self, lease: int) -> None:
        """End the lease now, deleting its keys; an ended or unknown lease is left alone."""

    @abc.abstractmethod
    def compare_and_delete(self, key: str, expected_revision: int) -> CasResult:
        """Delete the key only if its current revision is ``expected_revision``.

        On success ``current`` is ``None``. ``expected_revision == 0`` succeeds
        exactly when the key is already absent (and writes nothing).
        """

    @abc.abstractmethod
    def check(self) -> None:
        """Return if the store answers; raise ``StoreUnavailable`` with a clear
        one-line message if it cannot be reached. Meant for start-up and
        health probes, so it is cheap and bounded by the backend's timeout."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Idempotent; the store is unusable afterwards."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"


def validate_key(key: str) -> bytes:
    """The key as UTF-8; rejects what no backend can store (a programming error)."""
    if not isinstance(key, str):
        raise TypeError(f"store key must be str, got {type(key).__name__}")
    if not key:
        raise ValueError("store key must not be empty")
    return key.encode("utf-8")


def validate_write(value: bytes, expected_revision: int) -> None:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"store value must be bytes, got {type(value).__name__}")
    validate_revision(expected_revision)


def validate_txn(compares: Mapping[str, int], puts: Mapping[str, bytes], deletes: Iterable[str]) -> list[str]:
    """The deletes as a list, once every key, value and revision is checked (a programming error otherwise)."""
    gone = list(deletes)
    for key, revision in compares.items():
        validate_key(key)
        validate_revision(revision)
    for key, value in puts.items():
        validate_key(key)
        validate_write(value, 0)
    for key in gone:
        validate_key(key)
        if key in puts:
            raise ValueError(f"key {key!r} is both written and deleted in one transaction")
    return gone


def validate_revision(expected_revision: int) -> None:
    # bool is an int subclass; True as a revision is always a bug.
    if not isinstance(expected_revision, int) or isinstance(expected_revision, bool):
        raise TypeError(f"expected_revision must be int, got {type(expected_revision).__name__}")
    if expected_revision < 0:
        raise ValueError(f"expected_revision must be >= 0, got {expected_revision}")
