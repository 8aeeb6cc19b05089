"""Config layering: flags over FTHSDP_* over TOML over defaults."""

from __future__ import annotations

import pytest

from fthsdp.agent.node.config import config_from_args
from fthsdp.agent.training.config import ManagerConfig
from fthsdp.cli.main import build_parser, coordinator_config
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.errors import ConfigError
from fthsdp.core.every import Every, parse_every
from fthsdp.core.settings import field_docs, parse_duration, reference_markdown


def config(argv, env=None):
    args = build_parser().parse_args(["coordinator", *argv])
    return coordinator_config(args, env or {})


def test_defaults_work():
    c = config([])
    assert c.bind == "0.0.0.0:29510" and c.store == "memory" and c.job == ("default",)


def test_precedence(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('[coordinator]\nmin_replicas = 3\nheartbeat-timeout = "9s"\njoin_timeout = 4\nstore = "etcd://e:1"\n')
    env = {"FTHSDP_MIN_REPLICAS": "4", "FTHSDP_HEARTBEAT_TIMEOUT": "8s"}
    c = config(["--config", str(toml), "--min-replicas", "5"], env)
    assert c.min_replicas == 5  # flag over env and file
    assert c.heartbeat_timeout == 8.0  # env over file
    assert c.join_timeout == 4.0 and c.store == "etcd://e:1"  # file over defaults


def test_jobs_from_repeated_flags_and_commas():
    assert config(["--job", "a,b", "--job", "c"]).job == ("a", "b", "c")
    assert config([], {"FTHSDP_JOB": "x,y"}).job == ("x", "y")
    with pytest.raises(ConfigError, match="duplicate"):
        config(["--job", "a,a"])


def test_booleans():
    assert config(["--no-disconnect-is-failure"]).disconnect_is_failure is False
    assert config([], {"FTHSDP_DISCONNECT_IS_FAILURE": "off"}).disconnect_is_failure is False
    with pytest.raises(ConfigError, match="true or false"):
        config([], {"FTHSDP_DISCONNECT_IS_FAILURE": "maybe"})


@pytest.mark.parametrize("text, seconds", [
    ("250ms", 0.25), ("5s", 5.0), ("1.5m", 90.0), ("2h", 7200.0), ("3", 3.0), (".5", 0.5),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text, every", [
    ("500", Every(steps=500)), (" 0 ", Every()), (7, Every(steps=7)), ("90s", Every(seconds=90.0)),
    ("30m", Every(seconds=1800.0)), ("1.5h", Every(seconds=5400.0)), ("0.5s", Every(seconds=0.5)),
])
def test_intervals_are_steps_or_a_time(text, every):
    assert parse_every(text) == every
    assert parse_every(str(every)) == every  # the form passed to the ranks reads back the same


@pytest.mark.parametrize("text", ["-5", "5ms", "1.5", "ten", "", "5 steps", True, -1])
def test_a_bad_interval_is_one_clear_error(text):
    with pytest.raises(ConfigError, match="checkpoint-every"):
        parse_every(text, "--checkpoint-every")


def agent_config(argv):
    return config_from_args(build_parser().parse_args(["agent", "--replica-id", "r0", *argv, "--", "x"]), {})[0]


def test_checkpoint_every_reaches_the_ranks_as_the_agent_read_it(tmp_path):
    config = agent_config(["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "30m"])
    assert config.checkpoint_every == Every(seconds=1800.0)
    env = {"FTHSDP_COORDINATOR": "127.0.0.1:1", "FTHSDP_REPLICA_ID": "r0", "FTHSDP_CHECKPOINT_DIR": str(tmp_path),
           "FTHSDP_CHECKPOINT_EVERY": str(config.checkpoint_every)}
    assert ManagerConfig.from_env(env).checkpoint_every == Every(seconds=1800.0)
    assert ManagerConfig.from_env(env, checkpoint_every=40).checkpoint_every == Every(steps=40)
    with pytest.raises(ConfigError, match="need --checkpoint-dir"):
        agent_config(["--checkpoint-every", "500"])


def test_a_checkpoint_dir_that_cannot_be_written_is_one_config_error_and_a_missing_one_is_made(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    where = str(blocker / "ckpt")  # under a file: no folder can be made there (even by root)
    with pytest.raises(ConfigError, match=r"^--checkpoint-dir .*/a-file/ckpt: cannot write there \(Not a directory\)$"):
        agent_config(["--checkpoint-dir", where, "--checkpoint-every", "500"])
    env = {"FTHSDP_COORDINATOR": "127.0.0.1:1", "FTHSDP_REPLICA_ID": "r0", "FTHSDP_CHECKPOINT_DIR": where,
           "FTHSDP_CHECKPOINT_EVERY": "500"}
    with pytest.raises(ConfigError, match="^FTHSDP_CHECKPOINT_DIR .*: cannot write there"):
        ManagerConfig.from_env(env)
    missing = tmp_path / "new" / "ckpt"
    agent_config(["--checkpoint-dir", str(missing), "--checkpoint-every", "500"])
    assert missing.is_dir() and not list(missing.iterdir())  # made, and the write test left nothing


def test_every_field_is_documented():
    docs = field_docs(CoordinatorConfig)
    import dataclasses

    assert {f.name for f in dataclasses.fields(CoordinatorConfig)} == set(docs)
    assert all(len(text) > 10 for text in docs.values())
    assert "`--heartbeat-timeout`" in reference_markdown(CoordinatorConfig, "coordinator")


def test_help_shows_docs_and_env(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["coordinator", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "FTHSDP_HEARTBEAT_TIMEOUT" in out and "dropped from the next quorum" in out


@pytest.mark.parametrize("value, says", [("-1", "between 0 and"), ("lots", r"bad FTHSDP_\* setting")])
def test_a_bad_bucket_size_is_one_clear_error(value, says):
    env = {"FTHSDP_COORDINATOR": "127.0.0.1:1", "FTHSDP_REPLICA_ID": "r0", "FTHSDP_BUCKET_CAP_MB": value}
    with pytest.raises(ConfigError, match=says):
        ManagerConfig.from_env(env)
    with pytest.raises(ConfigError, match="bucket-cap-mb"):
        agent_config(["--bucket-cap-mb", value])
    assert ManagerConfig.from_env({**env, "FTHSDP_BUCKET_CAP_MB": "0"}).bucket_cap_mb == 0

