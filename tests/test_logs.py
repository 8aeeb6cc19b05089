"""Structured logs (--log-format json / FTHSDP_LOG_FORMAT) of the coordinator
and the agent, read from real processes' stderr."""

from __future__ import annotations

import json
import logging
import sys

from fthsdp.core.log_format import JsonFormatter
from tests.harness.cli import fthsdp, one_line_error
from tests.harness.processes import ROOT, CoordinatorProcess, ReplicaProcess
from tests.harness.waiting import wait_until
from tests.harness.web import members, page_url, status, steps

BASE_KEYS = {"time", "level", "logger", "message"}


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` as JSON; any other line fails the test."""
    out = []
    for line in text.splitlines():
        if line.strip():
            entry = json.loads(line)  # raises on a line that is not JSON
            assert BASE_KEYS <= set(entry), entry
            out.append(entry)
    return out


def test_coordinator_json_logs_have_one_line_per_quorum_change(tmp_path):
    c = CoordinatorProcess(tmp_path, "--log-format", "json", "--metrics-port", "0", "--heartbeat-interval", "100ms",
                           "--heartbeat-timeout", "1s").start()
    replicas = [ReplicaProcess(tmp_path, c.address, f"r{i}", "--step-period", "0.02").start() for i in range(2)]
    try:
        base = page_url(c)
        wait_until(lambda: members(status(base)) == ["r0", "r1"], 20, message="r0 and r1 in the quorum")
        replicas[1].kill()
        wait_until(lambda: members(status(base)) == ["r0"], 20, message="r1 out of the quorum")
        wait_until(lambda: steps(status(base))["r0"] > 100, 20, message="r0 past step 100")
        history = status(base)["history"]
    finally:
        for r in replicas:
            r.stop()
        c.stop()

    entries = json_lines(c.log_path.read_text())
    assert all(e["logger"].startswith("fthsdp") and e["level"] in ("info", "warning") for e in entries)
    changes = [e for e in entries if e.get("event") == "quorum_change"]
    assert [e["quorum_id"] for e in changes] == [h["id"] for h in reversed(history)]  # one line per change
    assert [e["members"] for e in changes][-2:] == [["r0", "r1"], ["r0"]]
    assert all(e["job"] == "default" and e["reason"] and e["reason"] in e["message"] for e in changes)
    assert "r1" in changes[-1]["reason"]
    # No line per step or per heartbeat at the default level: r0 took 100+ steps.
    assert len(entries) < 40, [e["message"] for e in entries]


def test_agent_json_logs_from_the_environment(tmp_path):
    c = CoordinatorProcess(tmp_path).start()
    try:
        result = fthsdp("agent", "--coordinator", c.address, "--replica-id", "r0", "--monitor-interval", "20ms",
                        "--", sys.executable, str(ROOT / "tests" / "rank_script.py"), str(tmp_path), "exit0",
                        env={"FTHSDP_LOG_FORMAT": "json"})
    finally:
        c.stop()
    assert result.returncode == 0, result.stderr
    states = [e for e in json_lines(result.stderr) if e.get("event") == "agent_state"]
    assert [e["state"] for e in states][-1] == "SUCCEEDED"
    assert all(e["replica"] == "r0" and e["node_rank"] == 0 for e in states)


def test_text_stays_the_default(tmp_path):
    c = CoordinatorProcess(tmp_path).start()
    c.stop()
    first = c.log_path.read_text().splitlines()[0]
    assert not first.startswith("{") and " INFO fthsdp.coordinator: " in first


def test_a_bad_log_format_is_one_line():
    one_line_error(fthsdp("coordinator", "--log-format", "xml"), 2, "--log-format must be text or json")
    one_line_error(fthsdp("agent", "--replica-id", "r0", "--", "true", env={"FTHSDP_LOG_FORMAT": "yaml"}), 2,
                   "--log-format must be text or json")


def test_json_formatter_fields_and_exceptions():
    record = logging.LogRecord("fthsdp.x", logging.ERROR, __file__, 1, "quorum %d", (3,), None)
    record.members = ["a", "b"]
    entry = json.loads(JsonFormatter().format(record))
    assert (entry["level"], entry["logger"], entry["message"], entry["members"]) == (
        "error", "fthsdp.x", "quorum 3", ["a", "b"])
    assert entry["time"].endswith("+00:00")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("fthsdp.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in entry["exception"] and "\n" not in JsonFormatter().format(record)
