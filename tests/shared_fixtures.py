"""Fixtures used by more than one test module, registered for the whole suite
by ``pytest_plugins`` in tests/conftest.py, so a test names them as arguments
and never imports them (an imported fixture is a redefinition to linters, and
pytest does not need the import).

A module may still define a fixture of the same name for itself (for example
test_coordinator_etcd's ``cluster``); pytest then uses that one in that module.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.processes import AgentProcess, CoordinatorProcess, WorkerProcess

# ----- the catch-up cluster (test_catchup and the tests built on it) --------------------

FOREVER = "1000000"
HIDDEN = "512"  # 0.5M parameters: 6.3 MB of state with AdamW


@pytest.fixture
def cluster(tmp_path):
    started = []

    def coordinator(*args: str) -> CoordinatorProcess:
        c = CoordinatorProcess(tmp_path, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s",
                               "--join-timeout", "2s", *args).start()
        started.append(c)
        return c

    def agent(c, i: int, n: int, *worker_args: str, env: dict | None = None,
              agent_args: tuple[str, ...] = ()) -> AgentProcess:
        a = AgentProcess(tmp_path, c.address, f"r{i}", i, n, "--steps", FOREVER, "--wait-for", str(n),
                         "--hidden", HIDDEN, *worker_args, env=env, agent_args=agent_args).start()
        started.append(a)
        return a

    def worker(c, i: int, n: int, *worker_args: str, env: dict | None = None, name: str = "") -> WorkerProcess:
        w = WorkerProcess(tmp_path, c.address, f"r{i}", i, "--steps", FOREVER, "--wait-for", str(n),
                          "--hidden", HIDDEN, *worker_args, env=env)
        if name:
            w.log_path = tmp_path / f"worker-{name}.log"
        w.start()
        started.append(w)
        return w

    yield coordinator, agent, worker
    stop_together([p for p in started if not isinstance(p, CoordinatorProcess)])
    for proc in reversed(started):
        proc.stop()


def stop_together(procs, timeout: float = 10.0) -> None:
    """SIGTERM every replica at once, then wait for them: one by one, each
    would drain while its peers still train, and wait for the next quorum."""
    for proc in procs:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        if proc.proc is None:
            continue
        try:
            proc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


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
