# --- state-store fixtures (real etcd) -----------------------------------------
# Self-contained: other fixtures may be added below this block.

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from fthsdp.testing.local_etcd import EtcdNotFound, EtcdServer
from tests.harness.ending import end_started, spawning_for


def _started_etcd() -> EtcdServer:
    try:
        server = EtcdServer()
    except EtcdNotFound as e:
        # Fail, never skip: `make test` installs etcd, and a suite that
        # silently drops its etcd half would hide a broken set-up.
        pytest.fail(str(e))
    server.start()
    return server


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd for the whole session. Tests share it, so each must keep
    to its own ``key_prefix`` and must not stop it (use ``private_etcd`` to
    kill or restart one)."""
    server = _started_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def private_etcd() -> Iterator[EtcdServer]:
    """An etcd of this test's own, free to be killed and restarted."""
    server = _started_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> Iterator[str]:
    """``etcd://127.0.0.1:PORT`` of the session etcd."""
    yield etcd_server.url


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """A key prefix no other test uses, ending in '/'."""
    yield f"/fthsdp-test/{uuid.uuid4().hex}/"

# --- end of state-store fixtures ----------------------------------------------

# Fixtures shared by several test modules (the catch-up ``cluster``, ``token_file``):
# registered here so tests take them as arguments instead of importing them.
pytest_plugins = ["tests.harness.fixtures"]


# --- the end of a test: what it started is killed, not stopped (tests/harness/ending.py) ---


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with spawning_for(fixturedef.scope):
        return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    end_started()
