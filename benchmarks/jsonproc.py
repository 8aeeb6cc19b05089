"""A child process whose stdout JSON lines are collected on a thread (benchmark helper)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

from fthsdp.demo.record import json_objects

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """Runs in a session of its own, so ``stop`` can kill its whole tree."""

    def __init__(self, argv, env, pump: bool = True, stderr_path: str | Path | None = None) -> None:
        """``stderr_path``: where the child's stderr goes (its logs), else nowhere."""
        stderr = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                  cwd=ROOT, start_new_session=True)
        if stderr_path:
            stderr.close()
        self.lines: queue.Queue = queue.Queue()
        if pump:
            threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.p.stdout:
            # Several objects on a line: a rank SIGKILLed between a line and its newline (unbuffered Python
            # writes them apart), and its restart's first line goes on on the same line (json_objects).
            for item in json_objects(line):
                item.setdefault("received", time.time())  # unix seconds it was read: for lines with no time
                self.lines.put(item)

    def until(self, predicate, timeout: float = 120.0) -> dict:
        """The next JSON line satisfying ``predicate``; queue.Empty after ``timeout``."""
        end = time.monotonic() + timeout
        while True:
            item = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            if predicate(item):
                return item

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGCONT)
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()
        self.p.stdout.close()
