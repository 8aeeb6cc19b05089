"""One builder for the ``cluster`` fixtures: coordinators and replica
processes started under a test's tmp_path, every one of them stopped at the
end, also when the test fails.

The fixtures differ only in what they pass: the coordinator flags every
coordinator gets, the worker's ``--steps`` and ``--hidden``, and how the
processes end (``teardown``):

- ``"stop"``: each stopped in the reverse order of its start;
- ``"together"``: every replica SIGTERMed at once (one by one, each would
  drain while its peers train on, and wait for the next quorum), then each
  stopped in reverse order;
- ``"kill"``: each SIGCONTed (a test may have SIGSTOPped it) and SIGKILLed,
  in the order of its start: nothing a dying replica does can matter then.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Literal

from tests.harness.processes import AgentProcess, CoordinatorProcess, ReplicaProcess, WorkerProcess

Teardown = Literal["stop", "together", "kill"]


class Cluster:
    def __init__(self, tmp_path: Path, *, coordinator_args: tuple[str, ...] = (), steps: str = "8",
                 hidden: str = "64", teardown: Teardown = "stop") -> None:
        self.tmp_path = tmp_path
        self.coordinator_args = coordinator_args
        self.steps = steps
        self.hidden = hidden
        self.teardown = teardown
        self.started: list = []

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def coordinator(self, *args: str, port: int = 0) -> CoordinatorProcess:
        """A coordinator process with the cluster's flags, then ``args``."""
        c = CoordinatorProcess(self.tmp_path, *self.coordinator_args, *args, port=port).start()
        self.started.append(c)
        return c

    def _worker_args(self, n: int, steps: str | None, hidden: str | None) -> tuple[str, ...]:
        return ("--steps", steps or self.steps, "--wait-for", str(n), "--hidden", hidden or self.hidden)

    def agent(self, c: CoordinatorProcess, i: int, n: int, *worker_args: str, env: dict | None = None,
              agent_args: tuple[str, ...] = ()) -> AgentProcess:
        """Replica r{i} of ``n``: ``fthsdp agent`` running tests/ftar_worker.py."""
        a = AgentProcess(self.tmp_path, c.address, f"r{i}", i, n, *self._worker_args(n, None, None), *worker_args,
                         env=env, agent_args=agent_args).start()
        self.started.append(a)
        return a

    def worker(self, c: CoordinatorProcess, i: int, n: int, *worker_args: str, env: dict | None = None,
               name: str = "", steps: str | None = None, hidden: str | None = None) -> WorkerProcess:
        """Replica r{i} of ``n``: tests/ftar_worker.py with no agent; ``name``
        gives its log a name of its own (a second incarnation of r{i})."""
        w = WorkerProcess(self.tmp_path, c.address, f"r{i}", i, *self._worker_args(n, steps, hidden), *worker_args,
                          env=env)
        if name:
            w.log_path = self.tmp_path / f"worker-{name}.log"
        w.start()
        self.started.append(w)
        return w

    def replicas(self, address: str, *ids: str) -> list[ReplicaProcess]:
        """Replica stand-ins (no training) registered with ``address``."""
        procs = [ReplicaProcess(self.tmp_path, address, rid).start() for rid in ids]
        self.started.extend(procs)
        return procs

    def close(self) -> None:
        if self.teardown == "kill":
            for proc in self.started:
                proc.signal(signal.SIGCONT)
                proc.kill()
            return
        if self.teardown == "together":
            stop_together([p for p in self.started if not isinstance(p, CoordinatorProcess)])
        for proc in reversed(self.started):
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
