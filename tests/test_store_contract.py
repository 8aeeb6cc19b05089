"""The Store contract (fthsdp/coordinator/store/base.py), run against every backend,
plus the parsing of --store URLs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from fthsdp.coordinator.store import CasResult, Store, Versioned, open_store
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.core.errors import ConfigError


@pytest.fixture(params=["memory", "etcd"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        s = open_store("memory")
    else:
        # Looked up only for this param so memory-only runs start no etcd.
        s = open_store(request.getfixturevalue("etcd_url"))
    try:
        yield s
    finally:
        s.close()


def test_get_missing_key_is_none(store: Store, key_prefix: str) -> None:
    assert store.get(key_prefix + "missing") is None


def test_create_with_zero_succeeds(store: Store, key_prefix: str) -> None:
    key = key_prefix + "k"
    res = store.compare_and_set(key, b"v1", 0)
    assert res.succeeded
    assert res.current is not None
    assert res.current.value == b"v1"
    assert res.current.revision > 0
    assert store.get(key) == res.current


def test_second_create_fails_and_returns_current(store: Store, key_prefix: str) -> None:
    key = key_prefix + "k"
    first = store.compare_and_set(key, b"first", 0)
    second = store.compare_and_set(key, b"second", 0)
    assert second == CasResult(succeeded=False, current=first.current)
    assert store.get(key) == first.current


def test_update_with_current_revision(store: Store, key_prefix: str) -> None:
    key = key_prefix + "k"
    created = store.compare_and_set(key, b"v1", 0).current
    assert created is not None
    res = store.compare_and_set(key, b"v2", created.revision)
    assert res.succeeded
    assert res.current is not None
    assert res.current.value == b"v2"
    assert res.current.revision > created.revision
    assert store.get(key) == res.current


def test_update_with_stale_revision_fails(store: Store, key_prefix: str) -> None:
    key = key_prefix + "k"
    v1 = store.compare_and_set(key, b"v1", 0).current
    assert v1 is not None
    v2 = store.compare_and_set(key, b"v2", v1.revision).current
    stale = store.compare_and_set(key, b"v3", v1.revision)
    assert stale == CasResult(succeeded=False, current=v2)
    assert store.get(key) == v2


def test_update_of_missing_key_fails(store: Store, key_prefix: str) -> None:
    key = key_prefix + "k"
    other = store.compare_and_set(key_prefix + "other", b"x", 0).current
    assert other is not None
    # A revision that exists in the store, but not for this key.
    assert store.compare_and_set(key, b"v", other.revision) == CasResult(False, None)
    assert store.get(key) is None


def test_compare_and_delete(store: Store, key_prefix: str) -> None:
    key = key_prefix + "k"
    v1 = store.compare_and_set(key, b"v1", 0).current
    assert v1 is not None
    v2 = store.compare_and_set(key, b"v2", v1.revision).current
    assert v2 is not None

    assert store.compare_and_delete(key, v1.revision) == CasResult(False, v2)
    assert store.compare_and_delete(key, 0) == CasResult(False, v2)
    assert store.get(key) == v2

    assert store.compare_and_delete(key, v2.revision) == CasResult(True, None)
    assert store.get(key) is None
    # Gone, so the old revision no longer matches, and "absent" (0) does.
    assert store.compare_and_delete(key, v2.revision) == CasResult(False, None)
    assert store.compare_and_delete(key, 0) == CasResult(True, None)
    # Re-creating after a delete gets a fresh, larger revision.
    again = store.compare_and_set(key, b"v3", 0).current
    assert again is not None and again.revision > v2.revision


def test_get_prefix_is_a_plain_string_prefix(store: Store, key_prefix: str) -> None:
    written = {}
    for suffix in ["a/b", "a/b/c", "a/b/d/e", "a/bc", "a/c", "b", "a"]:
        res = store.compare_and_set(key_prefix + suffix, suffix.encode(), 0)
        assert res.current is not None
        written[key_prefix + suffix] = res.current

    def under(p: str) -> dict[str, Versioned]:
        return {k: v for k, v in written.items() if k.startswith(key_prefix + p)}

    # Callers end directory prefixes with '/' to exclude siblings like a/bc ...
    got = store.get_prefix(key_prefix + "a/b/")
    assert set(got) == {key_prefix + "a/b/c", key_prefix + "a/b/d/e"}
    assert got == under("a/b/")
    # ... because without it the match is a plain string prefix.
    assert store.get_prefix(key_prefix + "a/b") == under("a/b")
    assert key_prefix + "a/bc" in store.get_prefix(key_prefix + "a/b")
    assert store.get_prefix(key_prefix) == written
    assert store.get_prefix(key_prefix + "zzz") == {}
    # The empty prefix matches everything, including keys of other tests.
    everything = store.get_prefix("")
    assert {k: everything[k] for k in written} == written


def test_binary_values_round_trip(store: Store, key_prefix: str) -> None:
    all_bytes = bytes(range(256))
    key = key_prefix + "bin"
    res = store.compare_and_set(key, all_bytes, 0)
    assert res.current is not None and res.current.value == all_bytes
    assert store.get(key) == res.current
    assert store.get_prefix(key_prefix)[key].value == all_bytes
    empty = store.compare_and_set(key, b"", res.current.revision)
    assert empty.succeeded
    assert store.get(key) == Versioned(b"", empty.current.revision)  # type: ignore[union-attr]


def test_unicode_keys(store: Store, key_prefix: str) -> None:
    key = key_prefix + "réplica/π/数"
    assert store.compare_and_set(key, b"x", 0).succeeded
    assert set(store.get_prefix(key_prefix + "réplica/")) == {key}


def test_concurrent_cas_increments_are_atomic(store: Store, key_prefix: str) -> None:
    key = key_prefix + "counter"
    threads_n, increments = 8, 25
    errors: list[BaseException] = []
    start = threading.Barrier(threads_n)

    def worker() -> None:
        try:
            start.wait()
            for _ in range(increments):
                while True:
                    cur = store.get(key)
                    n = int(cur.value) if cur else 0
                    res = store.compare_and_set(key, str(n + 1).encode(), cur.revision if cur else 0)
                    if res.succeeded:
                        break
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert not errors, errors
    final = store.get(key)
    assert final is not None and int(final.value) == threads_n * increments


def test_revisions_increase_across_keys(store: Store, key_prefix: str) -> None:
    a, b = key_prefix + "a", key_prefix + "b"
    revisions = []
    cur = {a: 0, b: 0}
    for key in [a, b, a, a, b, a]:
        res = store.compare_and_set(key, b"x", cur[key])
        assert res.succeeded and res.current is not None
        cur[key] = res.current.revision
        revisions.append(res.current.revision)
    assert revisions == sorted(set(revisions)), "revisions must strictly increase in write order"
    # A delete is a write too: whatever is written after it gets a larger revision.
    assert store.compare_and_delete(a, cur[a]).succeeded
    later = store.compare_and_set(b, b"y", cur[b]).current
    assert later is not None and later.revision > revisions[-1]


def test_a_transaction_writes_and_deletes_together_at_one_revision(store: Store, key_prefix: str) -> None:
    a, b, c = (key_prefix + k for k in "abc")
    old = store.compare_and_set(c, b"old", 0).current
    assert old is not None
    result = store.transact({a: 0, c: old.revision}, {a: b"1", b: b"2"}, [c])
    assert result.succeeded and set(result.revisions) == {a, b}
    assert len(set(result.revisions.values())) == 1 and result.revisions[a] > old.revision
    assert store.get(a) == Versioned(b"1", result.revisions[a]) and store.get(b).value == b"2"
    assert store.get(c) is None


def test_a_transaction_whose_compare_fails_writes_nothing_and_says_what_is_there(store: Store,
                                                                                 key_prefix: str) -> None:
    a, b, leader = (key_prefix + k for k in ("a", "b", "leader"))
    held = store.compare_and_set(leader, b"me", 0).current
    store.compare_and_set(leader, b"other", held.revision)  # another coordinator took over
    result = store.transact({a: 0, leader: held.revision}, {a: b"1", b: b"2"})
    assert not result.succeeded and not result.revisions
    assert result.current[a] is None and result.current[leader].value == b"other"
    assert store.get(a) is None and store.get(b) is None


def test_a_transaction_may_delete_an_absent_key(store: Store, key_prefix: str) -> None:
    result = store.transact({key_prefix + "absent": 0}, {}, [key_prefix + "absent"])
    assert result.succeeded and not result.revisions and store.get(key_prefix + "absent") is None


def test_a_key_written_and_deleted_in_one_transaction_is_a_programming_error(store: Store,
                                                                               key_prefix: str) -> None:
    with pytest.raises(ValueError, match="both written and deleted"):
        store.transact({}, {key_prefix + "k": b"v"}, [key_prefix + "k"])
    with pytest.raises(TypeError):
        store.transact({key_prefix + "k": True}, {})


def test_check_passes_when_reachable(store: Store) -> None:
    store.check()


def test_bad_arguments_are_programming_errors(store: Store, key_prefix: str) -> None:
    with pytest.raises(ValueError):
        store.get("")
    with pytest.raises(ValueError):
        store.compare_and_set(key_prefix + "k", b"v", -1)
    with pytest.raises(TypeError):
        store.compare_and_set(key_prefix + "k", "not bytes", 0)  # type: ignore[arg-type]
    assert store.get(key_prefix + "k") is None


# -- open_store ----------------------------------------------------------------


def test_open_memory() -> None:
    s = open_store("memory")
    assert isinstance(s, MemoryStore)
    assert s.description == "memory"


@pytest.mark.parametrize(
    ("url", "endpoints"),
    [
        ("etcd://127.0.0.1:2379", ["127.0.0.1:2379"]),
        ("etcd://etcd-0", ["etcd-0:2379"]),
        ("etcd://a:1,b:2,c", ["a:1", "b:2", "c:2379"]),
        ("etcd://[::1]:23790", ["[::1]:23790"]),
        ("etcd://[::1]", ["[::1]:2379"]),
        ("etcd://[fe80::1]:2,10.0.0.1:3", ["[fe80::1]:2", "10.0.0.1:3"]),
    ],
)
def test_open_etcd_urls(url: str, endpoints: list[str]) -> None:
    # Creating the store must not need etcd to be up (these hosts do not exist).
    s = open_store(url, timeout=0.5)
    try:
        assert s.description == "etcd://" + ",".join(endpoints)
    finally:
        s.close()


@pytest.mark.parametrize(
    "url",
    [
        "xyz", "", "Memory", "memory://", "http://127.0.0.1:2379", "etcd://", "etcd:127.0.0.1",
        "etcd://:2379", "etcd://host:", "etcd://host:abc", "etcd://host:0", "etcd://host:65536",
        "etcd://a:1,,b:2", "etcd://a:1,", "etcd://::1:2379", "etcd://[::1", "etcd://[]:1",
        "etcd://[::1]x", "etcd://host:2379/path", "etcd://user@host:2379", "etcd://host:-1",
    ],
)
def test_open_bad_urls(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_store(url)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("--store: expected 'memory' or 'etcd://HOST:PORT[,HOST:PORT...]', got ")
    assert repr(url) in msg


def test_open_bad_url_message_exactly() -> None:
    with pytest.raises(ConfigError, match=r"^--store: expected 'memory' or "
                       r"'etcd://HOST:PORT\[,HOST:PORT\.\.\.\]', got 'xyz'$"):
        open_store("xyz")


def test_open_etcd_bad_timeout() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        open_store("etcd://127.0.0.1:2379", timeout=0)


# ----- leases ----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "etcd"])
def leased(request: pytest.FixtureRequest):
    """(store, clock): a fake clock to move for memory; None for etcd, whose
    leases run on real time (the tests then wait on the condition)."""
    if request.param == "memory":
        clock = FakeClock()
        s: Store = MemoryStore(clock=clock)
    else:
        clock, s = None, open_store(request.getfixturevalue("etcd_url"))
    try:
        yield s, clock
    finally:
        s.close()


def test_a_revoked_lease_takes_its_keys_with_it(leased, key_prefix: str) -> None:
    store, _ = leased
    lease = store.grant_lease(30)
    kept = store.compare_and_set(key_prefix + "plain", b"p", 0).current
    held = store.compare_and_set(key_prefix + "held", b"h", 0, lease=lease).current
    store.revoke_lease(lease)
    assert store.get(key_prefix + "held") is None
    assert store.get(key_prefix + "plain") == kept
    assert not store.refresh_lease(lease)
    again = store.compare_and_set(key_prefix + "held", b"h2", 0).current  # absent: created anew
    assert again.revision > held.revision
    store.revoke_lease(lease)  # ended: nothing happens


def test_an_expired_lease_deletes_its_keys_and_cannot_be_refreshed(leased, key_prefix: str) -> None:
    from tests.harness.waiting import wait_until

    store, clock = leased
    lease = store.grant_lease(1)
    store.compare_and_set(key_prefix + "leader", b"me", 0, lease=lease)
    if clock is not None:
        clock.now += 0.5
        assert store.refresh_lease(lease)
        clock.now += 0.9  # 1.4 s after the grant, 0.9 s after the refresh: still alive
        assert store.get(key_prefix + "leader") is not None
        clock.now += 0.2
    else:
        assert store.refresh_lease(lease)
    wait_until(lambda: store.get(key_prefix + "leader") is None, 15, message="the key of the expired lease deleted")
    assert not store.refresh_lease(lease)


def test_unknown_leases(leased, key_prefix: str) -> None:
    store, _ = leased
    assert not store.refresh_lease(987654321)
    store.revoke_lease(987654321)
