"""``fthsdp ...`` run as a user runs it, and what a user's mistake must look like."""

from __future__ import annotations

import subprocess
import sys

from tests.harness.processes import ROOT, _env


def fthsdp(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fthsdp", *args],
        cwd=ROOT,
        env={**_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess, code: int, words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and words in errors[0], result.stderr
