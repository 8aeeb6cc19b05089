"""Deployment files use only real flags and settings."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from coordinator.cli import build_parser, coordinator_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def test_systemd_unit_command_and_env_file_parse():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "systemd" / "fthsdp-coordinator.service")
    argv = shlex.split(unit["Service"]["ExecStart"])
    assert argv[0].endswith("/fthsdp")
    args = build_parser().parse_args(argv[1:])  # exits on an unknown flag
    env = {}
    for line in (DEPLOY / "coordinator.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    config = coordinator_config(args, env)  # raises on an unknown or bad value
    assert config.store == "etcd://127.0.0.1:2379" and config.heartbeat_timeout == 5.0
    known = {f"FTHSDP_{name.upper()}" for name in vars(config)}
    assert set(env) <= known, set(env) - known
