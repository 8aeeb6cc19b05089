"""The embedded in-process store: the default when one machine runs everything."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from fthsdp.coordinator.store.base import (
    CasResult,
    Store,
    TxnResult,
    Versioned,
    validate_key,
    validate_revision,
    validate_txn,
    validate_write,
)
from fthsdp.core.errors import StoreError


class MemoryStore(Store):
    """A dict behind a lock, with etcd's revision semantics.

    Everything lives in this process: the data does NOT survive a restart of
    the coordinator, and two coordinators cannot share it. Use etcd when either
    matters.

    Revisions come from one store-wide counter, as in etcd, rather than a
    per-key counter, so that code tested against this store cannot come to
    rely on "revision == number of writes of this key", which etcd breaks.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Versioned] = {}
        self._revision = 0
        self._closed = False
        self._clock = clock
        self._leases: dict[int, tuple[float, float]] = {}
        """lease id -> (time to live, expiry on ``clock``)"""
        self._key_lease: dict[str, int] = {}
        self._lease_ids = itertools.count(1)

    @property
    def description(self) -> str:
        return "memory"

    def get(self, key: str) -> Versioned | None:
        validate_key(key)
        with self._lock:
            self._check_open()
            self._expire_leases()
            return self._data.get(key)

    def get_prefix(self, prefix: str) -> dict[str, Versioned]:
        if not isinstance(prefix, str):
            raise TypeError(f"store prefix must be str, got {type(prefix).__name__}")
        with self._lock:
            self._check_open()
            self._expire_leases()
            return {k: v for k, v in self._data.items() if k.startswith(prefix)}

    def compare_and_set(self, key: str, value: bytes, expected_revision: int, lease: int = 0) -> CasResult:
        validate_key(key)
        validate_write(value, expected_revision)
        with self._lock:
            self._check_open()
            self._expire_leases()
            if lease and lease not in self._leases:
                raise StoreError(f"lease {lease} has ended or never existed")
            current = self._data.get(key)
            if _revision_of(current) != expected_revision:
                return CasResult(succeeded=False, current=current)
            self._revision += 1
            # Copy so a caller mutating its bytearray cannot change stored data.
            written = Versioned(value=bytes(value), revision=self._revision)
            self._data[key] = written
            if lease:
                self._key_lease[key] = lease
            else:
                self._key_lease.pop(key, None)
            return CasResult(succeeded=True, current=written)

    def compare_and_delete(self, key: str, expected_revision: int) -> CasResult:
        validate_key(key)
        validate_revision(expected_revision)
        with self._lock:
            self._check_open()
            current = self._data.get(key)
            if _revision_of(current) != expected_revision:
                return CasResult(succeeded=False, current=current)
            if current is not None:
                # A delete is a write and takes a revision, as in etcd; deleting
                # an absent key writes nothing, so it does not.
                self._delete(key)
            return CasResult(succeeded=True, current=None)

    def transact(self, compares: Mapping[str, int], puts: Mapping[str, bytes],
                 deletes: Iterable[str] = ()) -> TxnResult:
        gone = validate_txn(compares, puts, deletes)
        with self._lock:
            self._check_open()
            self._expire_leases()
            if any(_revision_of(self._data.get(k)) != r for k, r in compares.items()):
                return TxnResult(False, current={k: self._data.get(k) for k in compares})
            present = [k for k in gone if k in self._data]
            if not puts and not present:
                return TxnResult(True)
            self._revision += 1  # one transaction, one revision (as etcd's)
            for key, value in puts.items():
                self._data[key] = Versioned(value=bytes(value), revision=self._revision)
                self._key_lease.pop(key, None)
            for key in present:
                del self._data[key]
                self._key_lease.pop(key, None)
            return TxnResult(True, revisions=dict.fromkeys(puts, self._revision))

    def grant_lease(self, ttl: float) -> int:
        if not ttl > 0:
            raise ValueError(f"a lease's time to live must be positive, got {ttl}")
        with self._lock:
            self._check_open()
            lease = next(self._lease_ids)
            self._leases[lease] = (ttl, self._clock() + ttl)
            return lease

    def refresh_lease(self, lease: int) -> bool:
        with self._lock:
            self._check_open()
            self._expire_leases()
            if lease not in self._leases:
                return False
            ttl, _ = self._leases[lease]
            self._leases[lease] = (ttl, self._clock() + ttl)
            return True

    def revoke_lease(self, lease: int) -> None:
        with self._lock:
            self._check_open()
            self._end_lease(lease)

    def _expire_leases(self) -> None:
        now = self._clock()
        for lease in [lease for lease, (_, expiry) in self._leases.items() if expiry <= now]:
            self._end_lease(lease)

    def _end_lease(self, lease: int) -> None:
        if self._leases.pop(lease, None) is None:
            return
        for key in [k for k, owner in self._key_lease.items() if owner == lease]:
            self._delete(key)

    def _delete(self, key: str) -> None:
        self._revision += 1
        del self._data[key]
        self._key_lease.pop(key, None)

    def check(self) -> None:
        with self._lock:
            self._check_open()

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            # Using a closed store is a bug in the caller, not an outage.
            raise RuntimeError("MemoryStore is closed")


def _revision_of(current: Versioned | None) -> int:
    return 0 if current is None else current.revision
