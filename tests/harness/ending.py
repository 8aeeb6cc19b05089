"""Ending what a test started, once the test is over: every process it (or
one of its function-scoped fixtures) spawned through tests/harness/processes.py
that is still running is SIGKILLed at once, with its descendants (an agent's
ranks, a store host), before the fixtures' own teardowns run.

Why: a fixture's teardown stops its processes gracefully and one by one (a
replica SIGTERMed drains, and waits for the quorum that drops it, while its
peers train on), a few seconds a test on 2 cores. Once the test has passed or
failed nothing those processes do can change its result, so tests/conftest.py
calls ``end_started()`` at the start of every test's teardown; the fixtures'
stops then find them ended. A test that wants a graceful stop does it itself,
in its body. Processes started by a module- or session-scoped fixture are
kept: the next test uses them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

_scopes: list[str] = []
"""The scopes of the fixtures being set up now (innermost last); none: the test itself."""
_started: list[tuple[subprocess.Popen, str]] = []
"""Every process spawned and the scope it was spawned for, until it is ended."""


@contextlib.contextmanager
def spawning_for(scope: str) -> Iterator[None]:
    """While a fixture of ``scope`` is set up (tests/conftest.py)."""
    _scopes.append(scope)
    try:
        yield
    finally:
        _scopes.pop()


def started(proc: subprocess.Popen) -> None:
    """A process was spawned (tests/harness/processes.py)."""
    _started.append((proc, _scopes[-1] if _scopes else "function"))


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # it ended meanwhile
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": the state, then the parent
        out.setdefault(ppid, []).append(int(name))
    return out


def end_started() -> None:
    """SIGKILL every process spawned for a test (not for a wider fixture) that
    still runs, and its descendants, all at once; then reap the ones spawned here."""
    kept, ending = [], []
    for proc, scope in _started:
        (kept if scope != "function" else ending).append((proc, scope))
    _started[:] = kept
    live = [proc for proc, _ in ending if proc.poll() is None]
    if not live:
        return
    children = _children()
    pids, todo = set(), [p.pid for p in live]
    while todo:
        pid = todo.pop()
        if pid not in pids:
            pids.add(pid)
            todo.extend(children.get(pid, []))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for proc in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


__all__ = ["end_started", "spawning_for", "started"]
