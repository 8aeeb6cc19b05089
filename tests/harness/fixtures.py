"""Fixtures used by more than one test module, registered for the whole suite
by ``pytest_plugins`` in tests/conftest.py, so a test names them as arguments
and never imports them (an imported fixture is a redefinition to linters, and
pytest does not need the import).

A module may still define a fixture of the same name for itself (test_ftar's and
test_coordinator_etcd's ``cluster``, built with the same tests.harness.cluster);
pytest then uses that one in that module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.cluster import Cluster

# ----- the catch-up cluster (test_catchup and the tests built on it) --------------------

FOREVER = "1000000"
HIDDEN = "512"  # 0.5M parameters: 6.3 MB of state with AdamW


CATCH_UP_COORDINATOR = ("--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s", "--join-timeout", "2s")


@pytest.fixture
def cluster(tmp_path):
    """The catch-up cluster: ``(coordinator, agent, worker)``, starters of
    processes that train ``FOREVER`` on a model of ``HIDDEN``; the replicas
    are SIGTERMed together at the end, then the coordinators stopped."""
    with Cluster(tmp_path, coordinator_args=CATCH_UP_COORDINATOR, steps=FOREVER, hidden=HIDDEN,
                 teardown="together") as built:
        yield built.coordinator, built.agent, built.worker


# ----- the admin token (test_web, test_drain) -----------------------------------------

TOKEN = "web-test-token-0123456789"


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


@pytest.fixture
def processes():
    """Stops whatever a test started, also when it fails."""
    started: list = []
    yield lambda p: started.append(p) or p
    for p in reversed(started):
        p.stop()
