"""`fthsdp demo`: a coordinator, several replicas, a failure and its recovery.

Everything runs as separate local processes on loopback: the coordinator
(embedded store, or a private etcd with ``--store etcd``) and simulated
replicas (``agent.simulated_replica``: real membership, simulated steps). One
replica is SIGKILLed; the demo shows how fast the survivors are told, then
restarts it and shows it catch up from a named source and rejoin. Every
process it started is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from coordinator.client import CoordinatorClient
from coordinator.errors import ConfigError
from coordinator.status_view import STATE_NAMES, status_table


class _Children:
    """Processes started by the demo, all stopped at exit."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=log, text=True)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(predicate, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: {what} did not happen within {timeout:g}s")
        time.sleep(poll)


def run_demo(replicas: int = 3, store: str = "memory", out: TextIO = sys.stdout) -> int:
    if replicas < 2:
        raise ConfigError("--replicas: the demo needs at least 2 replicas")
    if store not in ("memory", "etcd") and not store.startswith("etcd://"):
        raise ConfigError(f"--store: expected memory, etcd or etcd://HOST:PORT, got {store!r}")

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    with contextlib.ExitStack() as stack:
        logdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fthsdp-demo-")))
        children = _Children(logdir)
        stack.callback(children.stop_all)
        if store == "etcd":
            from coordinator.local_etcd import EtcdServer

            etcd = stack.enter_context(EtcdServer())
            store = etcd.url
            say(f"started a private etcd at {etcd.endpoint}")

        coordinator = children.start(
            "coordinator", "coordinator", "--bind", "127.0.0.1:0", "--store", store, "--min-replicas", "2",
            "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s", "--join-timeout", "2s",
        )
        line = _wait(coordinator.stdout.readline, 30, "coordinator start")
        if "listening on" not in line:
            raise RuntimeError(f"coordinator did not start; see {logdir / 'coordinator.log'}")
        address = line.split("listening on ")[1].split()[0]
        say(f"coordinator at {address} (store: {store})")
        client = stack.enter_context(CoordinatorClient([address]))

        def start_replica(rid: str, step: int = 0) -> subprocess.Popen:
            return children.start(
                rid, "agent.simulated_replica", "--coordinator", address, "--replica-id", rid,
                "--step", str(step), "--step-period", "0.05", "--catch-up-time", "0.5",
            )

        def states() -> dict[str, str]:
            return {r.replica_id: STATE_NAMES[r.state] for r in client.status().replicas}

        def members() -> list[str]:
            return [m.replica_id for m in client.status().quorum.members]

        ids = [f"r{i}" for i in range(replicas)]
        procs = {rid: start_replica(rid) for rid in ids}
        _wait(lambda: sorted(members()) == ids, 30, "the first quorum")
        time.sleep(1.0)  # let the replicas train a little, for the table
        say("\n" + status_table(client.status()) + "\n")

        victim = ids[-1]
        quorum_before = client.status().quorum.id
        say(f"SIGKILL {victim} ...")
        killed_at = time.monotonic()
        procs[victim].kill()
        _wait(lambda: victim not in members(), 10, "the failure to be noticed", poll=0.005)
        detected = time.monotonic() - killed_at
        status = client.status()
        say(f"quorum {quorum_before} -> {status.quorum.id} in {detected * 1000:.0f} ms: {status.quorum.reason}")
        say("\n" + status_table(status) + "\n")

        say(f"restarting {victim} from scratch (step 0) ...")
        restarted_at = time.monotonic()
        procs[victim] = start_replica(victim)
        _wait(lambda: states().get(victim) == "catching-up", 10, "catch-up to start")
        source = next(r.catch_up_source for r in client.status().replicas if r.replica_id == victim)
        say(f"{victim} is catching up from {source}")
        _wait(lambda: victim in members(), 30, "the restarted replica to rejoin")
        rejoined = time.monotonic() - restarted_at
        status = client.status()
        say(f"{victim} rejoined in quorum {status.quorum.id} {rejoined:.1f} s after its restart: {status.quorum.reason}")
        say("\n" + status_table(status) + "\n")
        say(
            "summary: failure pushed to the survivors in "
            f"{detected * 1000:.0f} ms; restart to rejoin {rejoined:.1f} s; "
            f"quorum ids {quorum_before} -> {status.quorum.id}, never reused."
        )
        say("(replicas in this demo are simulated: real membership, simulated steps; see README.)")
    return 0
