"""User mistakes end with one clear line and a non-zero exit, never a traceback;
and what `fthsdp status` shows of hangs and stragglers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from fthsdp.cli import main as cli
from fthsdp.coordinator.decisions.status_view import status_dict
from fthsdp.coordinator.serving import progress_view
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.testing.local_etcd import free_port
from tests.harness.cli import fthsdp, one_line_error
from tests.harness.processes import CoordinatorProcess
from tests.harness.runtimes import hung_runtime, straggler_runtime


def test_unreachable_etcd(tmp_path):
    result = fthsdp("coordinator", "--bind", "127.0.0.1:0", "--store", f"etcd://127.0.0.1:{free_port()}",
                    "--store-timeout", "1s")
    one_line_error(result, 1, "unreachable")


def test_port_taken(tmp_path):
    first = CoordinatorProcess(tmp_path).start()
    try:
        result = fthsdp("coordinator", "--bind", first.address)
        one_line_error(result, 2, f"cannot listen on {first.address}")
    finally:
        first.stop()


@pytest.mark.parametrize(
    "args, words",
    [
        (("--heartbeat-timeout", "soon"), "expected a duration"),
        (("--heartbeat-interval", "5s", "--heartbeat-timeout", "2s"), "must be shorter than"),
        (("--min-replicas", "0"), "at least 1"),
        (("--min-replicas", "two"), "expected an integer"),
        (("--store", "zookeeper://x"), "expected 'memory' or 'etcd://"),
        (("--store", "etcd://host:notaport"), "is not a number"),
        (("--bind", "nowhere"), "is not HOST:PORT"),
        (("--job", "a/b"), "may contain only"),
        (("--config", "/nonexistent/fthsdp.toml"), "cannot read config file"),
    ],
)
def test_bad_coordinator_settings(args, words):
    one_line_error(fthsdp("coordinator", *args), 2, words)


def test_bad_config_files(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[coordinator\nbind = 1")
    one_line_error(fthsdp("coordinator", "--config", str(broken)), 2, "not valid TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[coordinator]\nheartbeat_timout = '3s'\n")
    one_line_error(fthsdp("coordinator", "--config", str(unknown)), 2, "unknown setting 'heartbeat_timout'")
    os.chmod(broken, 0)
    if os.geteuid() != 0:  # root reads anything
        one_line_error(fthsdp("coordinator", "--config", str(broken)), 2, "cannot read config file")


def test_bad_environment_variable():
    one_line_error(fthsdp("coordinator", env={"FTHSDP_JOIN_TIMEOUT": "forever"}), 2, "FTHSDP_JOIN_TIMEOUT")


def test_unknown_flag_is_an_argparse_error():
    result = fthsdp("coordinator", "--no-such-flag")
    assert result.returncode == 2 and "unrecognized arguments: --no-such-flag" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_without_a_coordinator():
    one_line_error(fthsdp("status", "--coordinator", f"127.0.0.1:{free_port()}", "--timeout", "2"), 1,
                   "no coordinator answered")
    one_line_error(fthsdp("status", "--coordinator", "bad address"), 2, "is not HOST:PORT")


def test_status_unknown_job(tmp_path):
    proc = CoordinatorProcess(tmp_path, "--job", "a").start()
    try:
        one_line_error(fthsdp("status", "--coordinator", proc.address, "--job", "b"), 1, "unknown job 'b'")
        ok = fthsdp("status", "--coordinator", proc.address, "--json")
        assert ok.returncode == 0 and '"job": "a"' in ok.stdout
    finally:
        proc.stop()


def test_give_up_state_is_refused_in_one_line_unless_the_state_is_lost(tmp_path):
    proc = CoordinatorProcess(tmp_path).start()
    try:
        refused = fthsdp("give-up-state", "--coordinator", proc.address, "--step", "40")
        one_line_error(refused, 1, "job 'default' has not lost its state (no committed step yet); nothing to give up")
    finally:
        proc.stop()
    one_line_error(fthsdp("give-up-state", "--coordinator", proc.address, "--step", "0"), 2, "--step must be")
    missing = fthsdp("give-up-state", "--coordinator", proc.address)
    assert missing.returncode == 2 and "the following arguments are required: --step" in missing.stderr


def test_reopen_job_is_refused_in_one_line_unless_the_job_finished(tmp_path):
    proc = CoordinatorProcess(tmp_path).start()
    try:
        refused = fthsdp("reopen-job", "--coordinator", proc.address, "--step", "40")
        one_line_error(refused, 1, "job 'default' is not finished; nothing to reopen")
    finally:
        proc.stop()
    one_line_error(fthsdp("reopen-job", "--coordinator", proc.address, "--step", "0"), 2, "--step must be")


def test_console_script_and_module_entry_points():
    script = shutil.which("fthsdp", path=os.path.dirname(sys.executable))
    assert script, "pip install should put the fthsdp console script beside python"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "coordinator" in result.stdout and "status" in result.stdout
    result = fthsdp("coordinator", "--help")
    assert result.returncode == 0 and "--heartbeat-timeout" in result.stdout


# ----- status: progress, hangs and stragglers -------------------------------------------

class _Client:
    """Answers `fthsdp status` from a runtime in this process."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def status(self, job: str) -> pb.StatusResponse:
        return self.runtime.status(pb.StatusRequest(job=job))


def status_output(runtime, monkeypatch, capsys, *flags: str) -> str:
    monkeypatch.setattr(cli, "_client", lambda args, env: _Client(runtime))
    assert cli.main(["status", *flags], env={}) == 0
    return capsys.readouterr().out


def progress_rows(out: str) -> dict[str, list[str]]:
    """The rows of the progress table (below the replica table), split into cells."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["REPLICA", "PHASE"])
    rows = {}
    for line in lines[start + 1:]:
        if " taken out: " in line:
            break
        rows[line.split()[0]] = line.split()[1:]
    return rows


def test_status_shows_the_hang_limit_phases_and_why_a_replica_was_taken_out(monkeypatch, capsys):
    out = status_output(hung_runtime(), monkeypatch, capsys)
    assert "hang limit 2.0s   median step time 0.20s" in out
    assert progress_rows(out) == {
        "r0": ["all-reduce", "6.0s", "0.20s", "0.4x"],
        "r1": ["all-reduce", "6.0s", "0.20s", "0.4x"],
        "r2": ["computing", "6.1s", "0.20s", "3.5x"],
    }
    taken_out = [line for line in out.splitlines() if " taken out: " in line]
    assert len(taken_out) == 1
    assert taken_out[0].startswith("r2 taken out: hung: no progress at step 7 (computing for 6.1s)")
    # The replica table is unchanged.
    header = next(line for line in out.splitlines() if line.startswith("REPLICA  STATE"))
    assert header.split() == ["REPLICA", "STATE", "STEP", "HEARTBEAT", "ADDRESS", "RANKS", "CHECKSUM", "NOTE"]


def test_status_json_has_the_progress_fields(monkeypatch, capsys):
    view = json.loads(status_output(straggler_runtime(), monkeypatch, capsys, "--json"))
    assert view["hang_limit_s"] == 2.0 and view["median_step_time_s"] == pytest.approx(0.4)
    r = {replica["id"]: replica for replica in view["replicas"]}
    assert (r["r2"]["phase"], r["r2"]["step_time_s"], r["r2"]["compute_time_s"]) == ("computing", 0.4, 0.35)
    assert r["r2"]["straggler_score"] == 3.5 and r["r2"]["cordoned"] is True
    assert r["r2"]["hang_reason"].startswith("straggler: compute 3.5x the other members' median for 10 steps")
    assert r["r0"]["hang_reason"] is None


def test_status_shows_dashes_for_what_a_replica_did_not_report():
    status = pb.StatusResponse(job="j", hang_limit_s=300.0, replicas=[
        pb.ReplicaStatus(replica_id="new", phase=pb.PHASE_SECTION, phase_age_s=42.0, step_time_s=12.5),
        pb.ReplicaStatus(replica_id="old"),  # an older replica: no progress at all
    ])
    view = progress_view.progress_view(status, status_dict(status))
    assert view["median_step_time_s"] is None and view["replicas"][1]["phase"] is None
    lines = progress_view.progress_lines(view)
    assert "hang limit 300.0s   median step time - (none reported yet)" in lines
    assert [line.split() for line in lines[-2:]] == [["new", "section", "42.0s", "12.5s", "-"],
                                                     ["old", "-", "-", "-", "-"]]
    follower = pb.StatusResponse(follower=True)
    # The leader knows.
    assert progress_view.progress_lines(progress_view.progress_view(follower, status_dict(follower))) == []


def test_every_phase_has_a_word():
    words = {progress_view.phase_word(value) for value in pb.Phase.values()}
    assert words == {None, "computing", "all-reduce", "update", "section", "starting"}
