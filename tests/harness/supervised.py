"""A coordinator under a supervisor, as systemd's ``Restart=always`` (or a
Deployment) runs one: whenever its process ends, for any reason, another
starts on the same port with the same flags after ``restart_sec``. Its
output (stdout and stderr of every start) goes to one log file, which the
tests read with ``LogFile``: waiting on lines, never on time.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fthsdp.testing.local_etcd import EtcdServer, free_port
from tests.harness.processes import ROOT, _env

LOADED = re.compile(r"job (\S+): (\d+) replicas from the store; each has (\S+)s to reconnect")
"""The line a coordinator logs when it has loaded a job from the store and leads it."""


class LogFile:
    """A log that other processes append to; lines are read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        try:
            return self.path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def count(self) -> int:
        return len(self.lines())

    def wait_for(self, pattern: str | re.Pattern, after: int = 0, timeout: float = 30.0) -> tuple[int, re.Match]:
        """The first line from line ``after`` on that matches ``pattern``:
        (its index, the match). AssertionError after ``timeout``."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines()
            for i in range(after, len(lines)):
                match = regex.search(lines[i])
                if match:
                    return i, match
            if time.monotonic() >= deadline:
                tail = "\n".join(lines[-30:])
                raise AssertionError(f"no line matching {regex.pattern!r} in {self.path} within {timeout:g}s:\n{tail}")
            time.sleep(0.02)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines()[-n:])


class SupervisedCoordinator:
    """``python -m fthsdp coordinator --bind 127.0.0.1:PORT ARGS`` kept running: a
    process that ends is started again after ``restart_sec``."""

    def __init__(self, log_path: Path, *args: str, restart_sec: float = 0.1, port: int = 0) -> None:
        self.args = list(args)
        self.restart_sec = restart_sec
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = LogFile(log_path)
        self.starts = 0
        self.exits: list[int] = []
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True, name=f"supervisor-{self.port}")

    def start(self) -> SupervisedCoordinator:
        self._thread.start()
        return self

    def _supervise(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._stop.is_set():
                    return
                with open(self.log.path, "ab") as out:
                    self._proc = subprocess.Popen(
                        [sys.executable, "-m", "fthsdp", "coordinator", "--bind", self.address, *self.args],
                        cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                    )
                self.starts += 1
            code = self._proc.wait()
            self.exits.append(code)
            self._stop.wait(self.restart_sec)  # the supervisor's RestartSec, not a synchronisation

    def pid(self) -> int:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else 0

    def kill(self) -> None:
        """SIGKILL the running process (the supervisor starts another)."""
        pid = self.pid()
        if pid:
            signal_process(pid, signal.SIGKILL)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._thread.join(timeout=15)


def signal_process(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid``; False if it is gone."""
    import os

    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def etcd_pid(server: EtcdServer) -> int:
    """The pid of a private etcd (fthsdp/testing/local_etcd.py keeps its process
    private; stalling it with SIGSTOP needs the pid)."""
    proc = server._proc  # noqa: SLF001 - read only
    if proc is None or proc.poll() is not None:
        raise AssertionError("etcd is not running")
    return proc.pid


def stall_etcd(server: EtcdServer, seconds: float, stop: threading.Event | None = None) -> None:
    """SIGSTOP etcd for ``seconds`` (a disk or host stall), then SIGCONT."""
    pid = etcd_pid(server)
    signal_process(pid, signal.SIGSTOP)
    try:
        (stop or threading.Event()).wait(seconds)  # the stall's length: the fault itself
    finally:
        signal_process(pid, signal.SIGCONT)
