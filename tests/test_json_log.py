"""The tests' reader of --log-format json logs (tests/harness/events.py), on a
log the ranks share with their agent."""

from __future__ import annotations

import logging

from fthsdp.core.log_format import JsonFormatter
from tests.harness.events import JsonLog


def record(message: str, **fields) -> str:
    entry = logging.LogRecord("fthsdp.agent", logging.INFO, __file__, 1, message, (), None)
    entry.__dict__.update(fields)
    return JsonFormatter().format(entry)


def test_a_record_after_a_line_another_process_left_open_is_read(tmp_path):
    path = tmp_path / "agent.log"
    stopping = record("round 1 stopping", event="group_round", round=1, phase="stopping")
    with open(path, "w") as f:
        f.write(record("before", event="agent_state", state="RUNNING") + "\n")
        f.write('  File "/train.py", line 3 in step' + stopping + "\n")  # a rank's dump, cut mid-line
        f.write("loss 0.25 [progress]\r")  # a progress bar, its line not ended yet
    log = JsonLog(path)
    assert [r["message"] for r in log.events()] == ["before", "round 1 stopping"]
    assert log.find_event("group_round", round=1, phase="stopping") is not None
    with open(path, "a") as f:
        f.write(record("after") + "\n")
    assert [r["message"] for r in log.events()][-1] == "after"
