"""The README's samples, run as a reader would run them, and the FTHSDP_*
variables of the code against the docs.

* The training-API sample (the block after ``<!-- sample: training-api -->``)
  is saved as train.py and run on its own (one standalone replica, as
  ``python train.py`` would), then under a real coordinator and three real
  agents: every replica trains to the end, their checksums agree at every
  logged step, and the loss falls.
* The quickstart (the block after ``<!-- sample: quickstart -->``) is run by
  bash as written, but for its set-up line (this suite's venv is already
  there), the coordinator's port (a free one) and the number of steps
  (fewer, to fit the suite): the replica told to fail does, its agent
  restarts it, it catches up, and every replica finishes with the others.
* Every FTHSDP_* variable the code reads is named in README.md or docs/,
  and every one they name is read by the code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fthsdp.agent.node.config import AgentConfig
from fthsdp.agent.training.config import ManagerConfig
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.settings import env_name
from fthsdp.testing.local_etcd import free_port
from tests.harness.deploy_files import _Recording
from tests.harness.processes import ROOT, _env

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
VENV_BIN = Path(sys.executable).parent
VARIABLE = re.compile(r"\bFTHSDP_[A-Z0-9_]*[A-Z0-9]\b")


def sample(name: str) -> str:
    """The fenced block right after ``<!-- sample: NAME -->`` in the README."""
    match = re.search(rf"<!-- sample: {name} -->\n```\w*\n(.*?)\n```", README.read_text(), re.S)
    assert match, f"README.md has no block after <!-- sample: {name} -->"
    return match.group(1) + "\n"


def _shell_env() -> dict[str, str]:
    """A reader's shell with the venv active. Not unbuffered, as a reader's is
    not: the ranks share one terminal, and an unbuffered print writes a line
    and its newline apart, so that lines of several processes interleave."""
    env = _env()
    env.pop("PYTHONUNBUFFERED", None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


# ----- the training-API sample -------------------------------------------------------------


STEP_LINE = re.compile(r"^step (\d+) loss ([\d.]+) quorum (\d+) checksum='(\w*)'$", re.M)


def test_the_training_api_sample_runs_on_its_own(tmp_path):
    (tmp_path / "train.py").write_text(sample("training-api"))
    run = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    steps = [(int(s), float(loss)) for s, loss, _, _ in STEP_LINE.findall(run.stdout)]
    assert [s for s, _ in steps] == [50, 100, 150, 200], run.stdout
    assert steps[-1][1] < steps[0][1], f"the sample does not train: {steps}"
    warnings = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and "standalone replica" in warnings[0], run.stderr


def test_the_training_api_sample_trains_under_a_coordinator_and_three_agents(tmp_path):
    (tmp_path / "train.py").write_text(sample("training-api"))
    address = f"127.0.0.1:{free_port()}"
    env = _shell_env()
    coordinator = subprocess.Popen(["fthsdp", "coordinator", "--bind", address, "--min-replicas", "3"],
                                   cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                   stderr=open(tmp_path / "coordinator.log", "wb"))
    try:
        agents = [subprocess.Popen(["fthsdp", "agent", "--coordinator", address, "--replica-id", f"r{i}",
                                    "--num-replicas", "3", "--", sys.executable, "train.py"],
                                   cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                   stderr=open(tmp_path / f"agent-r{i}.log", "wb"), text=True)
                  for i in range(3)]
        outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    finally:
        coordinator.terminate()
        coordinator.wait(30)
    for i, agent in enumerate(agents):
        assert agent.returncode == 0, (tmp_path / f"agent-r{i}.log").read_text()[-3000:]
    lines = [STEP_LINE.findall(out) for out in outputs]
    assert all([int(s) for s, *_ in found] == [50, 100, 150, 200] for found in lines), outputs
    for step_lines in zip(*lines, strict=True):
        # One state per step in every replica: the same checksum, in one quorum.
        assert len({(s, q, checksum) for s, _, q, checksum in step_lines}) == 1, step_lines
        assert step_lines[0][3], "the replicas report a state checksum"
    assert float(lines[0][-1][1]) < float(lines[0][0][1])


# ----- the quickstart ----------------------------------------------------------------------


def test_the_quickstart_runs_as_written(tmp_path):
    block = sample("quickstart")
    first, *commands = block.splitlines()
    assert first.startswith("make install"), "the quickstart starts by setting up the venv"
    script = "\n".join(commands)
    assert "--steps 300" in script and "--fail-at-step 100" in script and "29510" in script
    port = free_port()
    script = (script.replace("29510", str(port))
              .replace("--steps 300", "--steps 60").replace("--fail-at-step 100", "--fail-at-step 20"))
    (tmp_path / "quickstart.sh").write_text(script + "\n")
    # The commands that name no coordinator take the default, 127.0.0.1:29510;
    # a reader whose coordinator is elsewhere says so once, as here.
    env = {**_shell_env(), "FTHSDP_COORDINATOR": f"127.0.0.1:{port}"}
    run = subprocess.run(["bash", "quickstart.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=540)
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in records if "failing" in r] == [20], "the replica told to fail at step 20 did"
    starts = [r for r in records if "start_step" in r]
    assert len(starts) == 4, "three replicas started, and the failed one again"
    (restart,) = [r for r in starts if r["catch_up"]]
    assert restart["replica"] == "r2" and restart["start_step"] > 20, restart
    assert [r["done"] for r in records if "done" in r] == [60, 60, 60], "every replica finished with the others"
    by_step: dict[int, set[str]] = {}
    for r in records:
        if "step" in r and r.get("checksum"):
            by_step.setdefault(r["step"], set()).add(r["checksum"])
    assert by_step and all(len(sums) == 1 for sums in by_step.values()), by_step
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


# ----- FTHSDP_* variables ------------------------------------------------------------------


def variables_the_code_reads() -> set[str]:
    """Every FTHSDP_* variable some part of fthsdp reads: the settings of the
    coordinator, the agent and the operator commands (one per config field),
    those of the training process (recorded as ManagerConfig.from_env asks
    for them), and the names written out in the package's source."""
    read = {env_name(f.name) for cls in (CoordinatorConfig, AgentConfig) for f in dataclasses.fields(cls)}
    env = _Recording()
    env.update(FTHSDP_REPLICA_ID="r0", FTHSDP_COORDINATOR="127.0.0.1:1")
    ManagerConfig.from_env(env)
    read |= {name for name in env.asked if name.startswith("FTHSDP_")}
    for path in (ROOT / "fthsdp").rglob("*.py"):
        read |= set(VARIABLE.findall(path.read_text()))
    return read


def variables_the_docs_name() -> dict[str, list[str]]:
    named: dict[str, list[str]] = {}
    for doc in (README, *DOCS):
        for name in VARIABLE.findall(doc.read_text()):
            named.setdefault(name, []).append(str(doc.relative_to(ROOT)))
    return named


def test_every_variable_the_code_reads_is_documented():
    missing = variables_the_code_reads() - set(variables_the_docs_name())
    assert not missing, f"read by the code, named in no doc (README.md, docs/*.md): {sorted(missing)}"


def test_every_variable_the_docs_name_is_read_by_the_code():
    read = variables_the_code_reads()
    unknown = {name: where for name, where in variables_the_docs_name().items() if name not in read}
    assert not unknown, f"named in the docs, read by no code: {unknown}"


@pytest.mark.parametrize("text, found", [
    ("set FTHSDP_TOKEN_FILE or FTHSDP_TLS_CA.", {"FTHSDP_TOKEN_FILE", "FTHSDP_TLS_CA"}),
    ("FTHSDP_* and FTHSDP_TLS_* are families, not names", set()),
])
def test_the_variable_pattern_takes_names_not_families(text, found):
    assert set(VARIABLE.findall(text)) == found
