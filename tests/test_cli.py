"""User mistakes end with one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from coordinator.local_etcd import free_port
from tests.processes import ROOT, CoordinatorProcess, _env


def fthsdp(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", *args],
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


def test_unreachable_etcd(tmp_path):
    result = fthsdp("coordinator", "--bind", "127.0.0.1:0", "--store", f"etcd://127.0.0.1:{free_port()}", "--store-timeout", "1s")
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
    one_line_error(fthsdp("status", "--coordinator", f"127.0.0.1:{free_port()}", "--timeout", "2"), 1, "no coordinator answered")
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


def test_console_script_and_module_entry_points():
    script = shutil.which("fthsdp", path=os.path.dirname(sys.executable))
    assert script, "pip install should put the fthsdp console script beside python"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "coordinator" in result.stdout and "status" in result.stdout
    result = subprocess.run([sys.executable, "-m", "coordinator", "--help"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "--heartbeat-timeout" in result.stdout
