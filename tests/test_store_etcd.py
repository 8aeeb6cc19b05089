"""EtcdStore against a real etcd that is missing, killed and restarted.

The contract itself is in test_store_contract.py; this is about outages:
every failure must surface as StoreUnavailable naming the endpoint, quickly,
and the same store object must work again once etcd is back.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from fthsdp.coordinator.store import Store, open_store
from fthsdp.coordinator.store.etcd import EtcdStore
from fthsdp.core.errors import StoreUnavailable
from fthsdp.testing.local_etcd import EtcdServer, free_port
from tests.harness.waiting import wait_until

# Generous for a loaded CI machine; on a quiet one it is well under a second.
FAIL_FAST_S = 5.0
RECOVERY_S = 20.0


def all_operations(store: Store, prefix: str) -> dict[str, Callable[[], object]]:
    return {
        "check": store.check,
        "get": lambda: store.get(prefix + "k"),
        "get_prefix": lambda: store.get_prefix(prefix),
        "compare_and_set": lambda: store.compare_and_set(prefix + "new", b"v", 0),
        "compare_and_delete": lambda: store.compare_and_delete(prefix + "k", 1),
    }


def assert_unavailable(op: Callable[[], object], endpoint: str) -> StoreUnavailable:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        op()
    elapsed = time.monotonic() - started
    assert elapsed < FAIL_FAST_S, f"took {elapsed:.1f}s to fail"
    msg = str(info.value)
    assert endpoint in msg and "\n" not in msg, msg
    # The library's exception stays reachable for debug logs.
    assert info.value.__cause__ is not None
    return info.value


def test_unreachable_endpoint_raises_store_unavailable(key_prefix: str) -> None:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    store = open_store(f"etcd://{endpoint}", timeout=1.0)  # must not raise
    try:
        err = assert_unavailable(store.check, endpoint)
        assert str(err) == f"etcd at {endpoint} is unreachable: connection refused"
        for op in all_operations(store, key_prefix).values():
            assert_unavailable(op, endpoint)
    finally:
        store.close()


def test_silent_endpoint_times_out(key_prefix: str) -> None:
    # Accepts TCP (the kernel does, from the backlog) but never speaks HTTP/2,
    # like a hung etcd: the per-RPC timeout must bound every call.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        store = open_store(f"etcd://{endpoint}", timeout=0.5)
        try:
            err = assert_unavailable(store.check, endpoint)
            assert "no answer within 0.5s" in str(err)
            for op in all_operations(store, key_prefix).values():
                assert_unavailable(op, endpoint)
        finally:
            store.close()


def test_several_endpoints_all_down_names_them_all(key_prefix: str) -> None:
    endpoints = [("127.0.0.1", free_port()), ("127.0.0.1", free_port())]
    store = EtcdStore(endpoints, timeout=1.0)
    try:
        for op in all_operations(store, key_prefix).values():
            err = assert_unavailable(op, f"127.0.0.1:{endpoints[0][1]}")
            assert f"127.0.0.1:{endpoints[1][1]}" in str(err)
    finally:
        store.close()


def test_dead_endpoint_next_to_a_live_one(etcd_server: EtcdServer, key_prefix: str) -> None:
    # Reads fail over within the call; writes may fail once (outcome unknown,
    # so not retried) and then go to the live member.
    store = EtcdStore([("127.0.0.1", free_port()), ("127.0.0.1", etcd_server.client_port)])
    try:
        for _ in range(3):
            assert store.get(key_prefix + "k") is None
        store.check()

        def create() -> bool:
            try:
                return store.compare_and_set(key_prefix + "k", b"v", 0).succeeded
            except StoreUnavailable:
                return False

        wait_until(create, RECOVERY_S, message="write through the live member")
    finally:
        store.close()


def test_kill_and_restart_same_store_recovers(private_etcd: EtcdServer, key_prefix: str) -> None:
    store = open_store(private_etcd.url, timeout=1.0)
    try:
        before = store.compare_and_set(key_prefix + "k", b"survives", 0).current
        assert before is not None

        private_etcd.kill()
        for op in all_operations(store, key_prefix).values():
            assert_unavailable(op, private_etcd.endpoint)

        # Poll through the store from the moment etcd is launched: this is what
        # exposes pyetcd's endpoint quarantine and gRPC's reconnect backoff.
        restarting = time.monotonic()
        private_etcd.restart(wait=False)
        wait_until(lambda: store.get(key_prefix + "k") is not None, RECOVERY_S,
                   message="the same EtcdStore reading again after etcd restarted")
        store_back = time.monotonic() - restarting
        private_etcd.wait_ready()
        print(f"the store read again {store_back:.2f}s after etcd was relaunched")

        # Acknowledged writes survive SIGKILL (etcd fsyncs before answering).
        assert store.get(key_prefix + "k") == before
        store.check()
        after = store.compare_and_set(key_prefix + "k", b"updated", before.revision)
        assert after.succeeded and after.current is not None
        assert after.current.revision > before.revision
    finally:
        store.close()


def test_graceful_stop_then_restart(private_etcd: EtcdServer, key_prefix: str) -> None:
    store = open_store(private_etcd.url, timeout=1.0)
    try:
        assert store.compare_and_set(key_prefix + "k", b"v", 0).succeeded
        private_etcd.stop()
        assert_unavailable(lambda: store.get(key_prefix + "k"), private_etcd.endpoint)
        private_etcd.start()
        wait_until(lambda: store.check() is None, RECOVERY_S, message="store usable after etcd restart")
        assert store.get(key_prefix + "k") is not None
    finally:
        store.close()


def test_closed_store_is_a_programming_error(etcd_url: str, key_prefix: str) -> None:
    store = open_store(etcd_url)
    store.close()
    store.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        store.get(key_prefix + "k")
