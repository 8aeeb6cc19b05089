"""The embedded in-process store: the default when one machine runs everything."""

from __future__ import annotations

import threading

from coordinator.store.base import (
    CasResult,
    Store,
    Versioned,
    validate_key,
    validate_revision,
    validate_write,
)


class MemoryStore(Store):
    """A dict behind a lock, with etcd's revision semantics.

    Everything lives in this process: the data does NOT survive a restart of
    the coordinator, and two coordinators cannot share it. Use etcd when either
    matters.

    Revisions come from one store-wide counter, as in etcd, rather than a
    per-key counter, so that code tested against this store cannot come to
    rely on "revision == number of writes of this key", which etcd breaks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Versioned] = {}
        self._revision = 0
        self._closed = False

    @property
    def description(self) -> str:
        return "memory"

    def get(self, key: str) -> Versioned | None:
        validate_key(key)
        with self._lock:
            self._check_open()
            return self._data.get(key)

    def get_prefix(self, prefix: str) -> dict[str, Versioned]:
        if not isinstance(prefix, str):
            raise TypeError(f"store prefix must be str, got {type(prefix).__name__}")
        with self._lock:
            self._check_open()
            return {k: v for k, v in self._data.items() if k.startswith(prefix)}

    def compare_and_set(self, key: str, value: bytes, expected_revision: int) -> CasResult:
        validate_key(key)
        validate_write(value, expected_revision)
        with self._lock:
            self._check_open()
            current = self._data.get(key)
            if _revision_of(current) != expected_revision:
                return CasResult(succeeded=False, current=current)
            self._revision += 1
            # Copy so a caller mutating its bytearray cannot change stored data.
            written = Versioned(value=bytes(value), revision=self._revision)
            self._data[key] = written
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
                self._revision += 1
                del self._data[key]
            return CasResult(succeeded=True, current=None)

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
