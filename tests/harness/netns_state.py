"""What a NetLab (tests/harness/netns.py) records of itself, and the removal of what
a dead run left: its namespaces, its links and the processes inside them.

Each lab records its owner (pid and start time) in STATE_DIR/PREFIX.json,
under a lock, before it makes anything, so that a later run can tell a dead
run's leftovers from a live lab in parallel.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

STATE_DIR = Path("/run/fthsdp-netlab")
PREFIX_HEAD = "fn"


def run(*argv: str, check: bool = True, timeout: float = 15.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run("ip", *args, check=check)


def start_time(pid: int) -> str:
    """The process's start time in clock ticks (against pid reuse), "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def netns_names() -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def link_names() -> list[str]:
    out = run("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def kill_inside(ns: str) -> None:
    """SIGKILL the processes inside one of our namespaces (by pid), and wait for them to go."""
    for _ in range(50):
        pids = [int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and any(start_time(p) for p in pids):
            time.sleep(0.02)


def remove_prefix(prefix: str) -> None:
    """Remove every namespace and link named PREFIX*, and the processes in those namespaces."""
    for ns in netns_names():
        if ns.startswith(prefix + "-"):
            kill_inside(ns)
            run("ip", "netns", "del", ns, check=False)
    for link in link_names():
        if link.startswith(prefix + "-"):
            ip("link", "del", link, check=False)
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{prefix}.json").unlink()


def remove_leftovers() -> list[str]:
    """Remove what runs that are no longer alive left behind; the prefixes removed."""
    removed = []
    with state_lock():
        for path in STATE_DIR.glob(f"{PREFIX_HEAD}*.json"):
            try:
                owner = json.loads(path.read_text())
            except (OSError, ValueError):
                owner = {"pid": -1, "start": ""}
            if owner.get("pid", -1) > 0 and start_time(owner["pid"]) == owner.get("start"):
                continue  # a live run, perhaps in parallel
            remove_prefix(path.stem)
            removed.append(path.stem)
    return removed
