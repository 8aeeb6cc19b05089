"""The processes the demo starts, and the guarantee that none outlives it.

Every child (the coordinator, each ``fthsdp agent``; the agents start the
training ranks and their warm standbys) runs

* in a session of its own, so a Ctrl-C in the terminal reaches only the demo,
  which then stops the children in order (agents first, so that their ranks
  leave the job, then the coordinator);
* with ``PR_SET_PDEATHSIG`` (setpriv), so that even a SIGKILLed demo takes the
  coordinator and the agents with it, and they take their ranks;
* with ``FTHSDP_DEMO_RUN=<this run's id>`` in its environment, inherited by
  everything below it: the last step of the clean-up SIGKILLs whatever still
  carries the mark, found by a scan of /proc, whoever its parent is now.
"""

from __future__ import annotations

import os
import signal
import site
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from fthsdp.core.child_process import die_with_parent_prefix

MARKER_ENV = "FTHSDP_DEMO_RUN"
IMPORT_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the ``fthsdp`` package the demo runs: site-packages for
an installed fthsdp, the repository for a checkout."""


def _import_path() -> str:
    """What the children need on PYTHONPATH to import the fthsdp the demo runs:
    nothing when it is installed (in this interpreter's site-packages), else
    its folder (a checkout, editable-installed or not), which then comes
    before any other fthsdp installed in this environment."""
    folders = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    installed = {Path(folder).resolve() for folder in folders}
    return "" if IMPORT_ROOT in installed else str(IMPORT_ROOT)


def marked_pids(marker: str, name: str = MARKER_ENV) -> list[int]:
    """Live processes (zombies have no environment left) whose environment
    holds ``NAME=marker``; the calling process is never listed."""
    needle = f"{name}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def child_environment(base: Mapping[str, str], marker: str) -> dict[str, str]:
    """The environment of the demo's children: the user's, less any FTHSDP_*
    setting (the demo is self-contained), plus the run's mark; run from a
    checkout, its folder heads PYTHONPATH (not needed for an installed fthsdp)."""
    env = {k: v for k, v in base.items() if not k.startswith("FTHSDP_")}
    path = os.pathsep.join(p for p in (_import_path(), base.get("PYTHONPATH", "")) if p)
    if path:
        env["PYTHONPATH"] = path
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")  # the replicas share the machine's cores
    env[MARKER_ENV] = marker
    return env


class Child:
    """One child process, run in ``cwd``; its stdout lines go to ``on_line``
    (from a reader thread) and to ``NAME.out`` in the log folder, its stderr
    to ``NAME.log``."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], logdir: Path,
                 on_line: Callable[[str, float], None], stops_first: bool, cwd: Path | None = None) -> None:
        self.name = name
        self.stops_first = stops_first
        self.log_path = logdir / f"{name}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*die_with_parent_prefix(), *argv], env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, args=(logdir / f"{name}.out", on_line),
                                        name=f"demo-{name}-stdout", daemon=True)
        self._reader.start()

    def _read(self, path: Path, on_line: Callable[[str, float], None]) -> None:
        assert self.proc.stdout is not None  # started with stdout=PIPE
        with open(path, "a") as copy:
            for line in self.proc.stdout:
                copy.write(line)
                copy.flush()
                on_line(line.rstrip("\n"), time.monotonic())

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Children:
    """Starts the demo's processes (in ``cwd``: the demo's output folder; by
    default the current directory) and stops every one of them, in order."""

    def __init__(self, logdir: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self.logdir = logdir
        self.cwd = cwd
        self.marker = uuid.uuid4().hex
        self.env = child_environment(os.environ if env is None else env, self.marker)
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], on_line: Callable[[str, float], None],
              stops_first: bool = False) -> Child:
        """Start ``argv``; ``stops_first`` children get SIGTERM before the others."""
        child = Child(name, argv, self.env, self.logdir, on_line, stops_first, self.cwd)
        self.children.append(child)
        return child

    @staticmethod
    def python(module: str, *args: str) -> list[str]:
        return [sys.executable, "-m", module, *args]

    def stop_all(self, grace: float = 15.0) -> list[int]:
        """SIGTERM the ``stops_first`` children (agents drain their ranks),
        then the others; SIGKILL what is left after ``grace`` seconds in all,
        then every process still carrying the mark. Returns the pids that had
        to be killed by the mark (none when everything stopped as it should)."""
        deadline = time.monotonic() + grace
        first = [c for c in self.children if c.stops_first]
        for batch in (first, [c for c in self.children if not c.stops_first]):
            for child in batch:
                if child.proc.poll() is None:
                    child.signal_group(signal.SIGCONT)  # a stopped process acts on SIGTERM only once resumed
                    child.signal_group(signal.SIGTERM)
            for child in batch:
                try:
                    child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.signal_group(signal.SIGKILL)
                    child.proc.wait()
        leftovers = marked_pids(self.marker)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # Reaped by their parents (or init) in a moment; wait for the kernel to have them gone.
        end = time.monotonic() + 10.0
        while marked_pids(self.marker) and time.monotonic() < end:
            time.sleep(0.02)
        return leftovers
