"""The benchmarks' readers of the ranks' JSON lines (benchmarks/jsonproc.py,
benchmarks/accuracy_job.py) on output as an agent's stdout carries it: Python
unbuffered writes a printed line and its newline apart, so a rank SIGKILLed
between the two leaves its line open and its restart's first line goes on on
it (catchup.py's rejoin once waited 600 s for a restarted rank's line so hidden)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is not an installed package

from benchmarks.accuracy_job import _Lines  # noqa: E402
from benchmarks.jsonproc import Proc  # noqa: E402

KILLED_MID_LINE = '{"step": 35, "t": 1.0}'
RESTARTED = '{"replica": "r2", "pid": 7512, "start_step": 41}'


def test_a_child_line_left_open_does_not_hide_the_next_one():
    script = f"import sys; sys.stdout.write({KILLED_MID_LINE!r}); sys.stdout.write({RESTARTED!r} + '\\n')"
    proc = Proc([sys.executable, "-c", script], env=None)
    try:
        first = proc.until(lambda item: True, timeout=60)
        again = proc.until(lambda item: True, timeout=60)
    finally:
        proc.stop()
    assert first["step"] == 35 and again["pid"] == 7512


def test_the_accuracy_job_reads_both_objects_of_such_a_line():
    lines = _Lines()
    lines.rank_line("r2", KILLED_MID_LINE + RESTARTED)
    lines.rank_line("r2", "not json")
    assert [obj.get("pid") for obj in lines.by_replica["r2"]] == [None, 7512]
    assert lines.top_step == 0  # no "loss": neither is a training step's line
