"""Real OS processes for integration tests: a coordinator and replica stand-ins.

Each runs with ``python -m`` from the repository, talks real gRPC on loopback
and is stopped (or SIGKILLed) by the test. Waiting is always on a condition
with a deadline.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fthsdp.demo.record import json_objects
from tests.harness.ending import started

ROOT = Path(__file__).resolve().parents[2]
CROSS_REPLICA_GROUPS = os.environ.get("TEST_CROSS_REPLICA_GROUPS", "auto")
"""How the replicas' cross-replica groups follow the quorum (auto, reconfigure
or per-quorum: fthsdp/agent/training/transport/): `make test-per-quorum` runs
recovery, partition and oracle tests with per-quorum on a torch that could
reconfigure, the path a torch without it takes. Passed to every agent as
``--cross-replica-groups`` and to every bare worker as its variable."""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    # A process that aborts or crashes (a native abort in Python's teardown) dumps every
    # Python thread's stack to its stderr, which the tests keep in its log.
    env["PYTHONFAULTHANDLER"] = "1"
    if CROSS_REPLICA_GROUPS != "auto":
        env["FTHSDP_CROSS_REPLICA_GROUPS"] = CROSS_REPLICA_GROUPS
    return env


class _Process:
    """A child process whose stdout lines are read on a thread into a queue."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.history: list[str] = []

    def spawn(self) -> None:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        started(self.proc)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def next_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.argv[2:4]} printed nothing for {timeout}s; log:\n{self.log_tail()}") from None
        self.history.append(line)
        return line

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def exit_code(self, timeout: float) -> int:
        """Wait for the process to end; one that does not is a failure that shows its log."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.argv[2:4]} still running after {timeout:g}s; log:\n"
                                 f"{self.log_tail(60)}") from None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode


class CoordinatorProcess(_Process):
    """``python -m fthsdp coordinator --bind 127.0.0.1:PORT ...``; ``address`` once started."""

    def __init__(self, tmp: Path, *args: str, port: int = 0) -> None:
        self.extra = list(args)
        self.port = port
        self.address = ""
        super().__init__([], tmp / "coordinator.log")

    def start(self, timeout: float = 20.0) -> CoordinatorProcess:
        self.argv = [sys.executable, "-m", "fthsdp", "coordinator", "--bind", f"127.0.0.1:{self.port}", *self.extra]
        self.lines = queue.Queue()
        self.spawn()
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(max(0.1, deadline - time.monotonic()))
            if "listening on" in line:
                self.address = line.split("listening on ")[1].split()[0]
                self.metrics_url = line.split("metrics on ")[1].split()[0] if "metrics on " in line else ""
                self.port = int(self.address.rsplit(":", 1)[1])
                return self


class ReplicaProcess(_Process):
    """fthsdp.testing.simulated_replica: registers, watches, prints events as JSON lines."""

    def __init__(self, tmp: Path, coordinator: str, replica_id: str, *args: str) -> None:
        argv = [
            sys.executable,
            "-m",
            "fthsdp.testing.simulated_replica",
            "--coordinator",
            coordinator,
            "--replica-id",
            replica_id,
            *args,
        ]
        super().__init__(argv, tmp / f"replica-{replica_id}.log")
        self.replica_id = replica_id
        self.events: list[dict] = []
        self._cursor = 0

    def start(self) -> ReplicaProcess:
        self.spawn()
        return self

    def wait_event(self, predicate, timeout: float = 20.0) -> dict:
        """The next event, after the last one a wait returned, that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            while self._cursor < len(self.events):
                event = self.events[self._cursor]
                self._cursor += 1
                if predicate(event):
                    return event
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"replica {self.replica_id}: no matching event in {timeout}s; got {self.events[-3:]}")
            event = json.loads(self.next_line(left))
            if "quorum_id" in event:
                self.events.append(event)

    def wait_members(self, members: list[str], timeout: float = 20.0) -> dict:
        return self.wait_event(lambda e: sorted(e["members"]) == sorted(members), timeout)


class WorkerProcess(_Process):
    """tests/ftar_worker.py under fthsdp.agent.training.manager: one JSON line per committed step."""

    def __init__(self, tmp: Path, coordinator: str, replica_id: str, replica_rank: int, *args: str,
                 env: dict | None = None) -> None:
        argv = [sys.executable, "-m", "tests.ftar_worker", *args]
        super().__init__(argv, tmp / f"worker-{replica_id}.log")
        self.replica_id = replica_id
        self.env = {
            "FTHSDP_COORDINATOR": coordinator,
            "FTHSDP_REPLICA_ID": replica_id,
            "FTHSDP_REPLICA_RANK": str(replica_rank),
            "FTHSDP_FTAR_TIMEOUT": "30",
            "FTHSDP_CHECKSUM_EVERY": "1",  # the tests compare replicas at every step
            **(env or {}),
        }
        self.steps: dict[int, dict] = {}
        """Each step's last line."""
        self.step_lines: list[dict] = []
        """Every step line of every incarnation (one a killed incarnation and its restart both printed: twice)."""
        self.done: dict | None = None

    def spawn(self) -> None:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env={**_env(), **self.env}, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        started(self.proc)
        self._pumper = threading.Thread(target=self._pump, args=(self.proc,), daemon=True)
        self._pumper.start()

    def start(self) -> WorkerProcess:
        self.spawn()
        return self

    def read_until(self, predicate, timeout: float = 60.0) -> dict:
        """Consume JSON lines until one satisfies ``predicate``; steps are recorded."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"worker {self.replica_id}: nothing matching in {timeout}s; log:\n{self.log_tail()}")
            for line in self._record(self.next_line(left)):
                if predicate(line):
                    return line

    def drain(self) -> None:
        """Record every line printed so far that nobody read yet, without waiting for more."""
        while True:
            try:
                raw = self.lines.get_nowait()
            except queue.Empty:
                return
            self.history.append(raw)
            self._record(raw)

    def _record(self, raw: str) -> list[dict]:
        """The JSON objects of one printed line; steps and the end are recorded."""
        objects = json_objects(raw)
        for line in objects:
            if "step" in line:
                self.steps[line["step"]] = line
                self.step_lines.append(line)
            if "done" in line:
                self.done = line
        return objects

    def collect_after_exit(self, timeout: float = 30.0) -> int:
        """Wait for the process to end and record every step it printed."""
        code = self.proc.wait(timeout=timeout)
        self._pumper.join(timeout)
        self.drain()
        return code

    def finish(self, timeout: float = 60.0) -> dict:
        self.read_until(lambda line: "done" in line, timeout)
        assert self.proc.wait(timeout=30) == 0
        return self.done


class AgentProcess(WorkerProcess):
    """``fthsdp agent`` running tests/ftar_worker.py as its rank; the worker's
    JSON lines come through the agent's stdout."""

    def __init__(self, tmp: Path, coordinator: str, replica_id: str, replica_rank: int, num_replicas: int,
                 *worker_args: str, agent_args: tuple[str, ...] = (), env: dict | None = None,
                 worker: str = "tests.ftar_worker") -> None:
        super().__init__(tmp, coordinator, replica_id, replica_rank)
        self.argv = [
            sys.executable, "-m", "fthsdp", "agent", "--coordinator", coordinator,
            "--replica-id", replica_id, "--replica-rank", str(replica_rank), "--num-replicas", str(num_replicas),
            "--nproc", "1", "--restart-backoff", "100ms", "--cross-replica-groups", CROSS_REPLICA_GROUPS, *agent_args,
            "--", sys.executable, "-m", worker, *worker_args,
        ]
        self.log_path = tmp / f"agent-{replica_id}.log"
        self.env = {"FTHSDP_FTAR_TIMEOUT": "30", "FTHSDP_CHECKSUM_EVERY": "1", **(env or {})}
