"""Every benchmark runs from a clean clone: each one once, on its smallest
setting (slow: minutes together). This proves the scripts work with the
code as it is, not their figures: the tables in benchmarks/README.md come
from full runs. accuracy.py is the exception: its smallest setting is three
80-step jobs (over three minutes), so tests/test_accuracy_bench.py runs one
real job with a kill and the script's main on jobs' lines made in process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fthsdp.agent.training.transport import reconfigure

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SMOKE = {
    "ftar": (["--sizes-mb", "1", "--replicas", "2", "--pairs", "1"], 300),
    "step_time": (["--replicas", "2", "--pairs", "1", "--steps", "20", "--bucket-caps", "35"], 300),
    "step_profile": (["--model", "gpt", "--rounds", "1", "--steps", "20"], 300),
    "gpu_step": (["--device", "cpu", "--pairs", "1", "--steps", "20", "--state-mib", "16", "--dtypes", "float32"],
                 300),
    "failover": (["--trials", "1", "--cases", "rank killed"], 600),
    "groups": (["--trials", "1"], 600),
    "group_restart": (["--trials", "1", "--cases", "two hosts of 1 rank"], 600),
    "catchup": (["--trials", "1", "--mib", "8", "--skip-large", "--skip-torchft", "--restarts", "standby"], 900),
    "catchup_server": (["--mib", "8", "--trials", "1", "--requests", "50"], 300),
    "checkpoint": (["--mib", "8", "--trials", "1", "--hidden", "256", "--every", "5", "--intervals", "2",
                    "--pairs", "1", "--restore-mib", "8"], 600),
    "coordinator_scale": (["--replicas", "20", "--clients", "1", "--seconds", "2"], 300),
    "host_scale": (["--hosts", "32", "--seconds", "1"], 300),
    "relay_pings": (["--hosts", "5", "--seconds", "2"], 300),
    "ping_cost": (["--batches", "20", "--trials", "1"], 300),
    "relay_pings:fit": (["--fit", "2,8", "--hosts", "5", "--seconds", "2"], 300),
    "control_plane": (["--hosts", "32", "--hosts-per-group", "4", "--clients", "1", "--seconds", "2"], 300),
    "control_plane:tree": (["--hosts", "32", "--hosts-per-group", "4", "--clients", "1", "--seconds", "2",
                            "--shape", "tree"], 300),
    "state_hash": (["--trials", "1", "--mib", "8", "--model", "gpt", "--steps", "1"], 300),
    "goodput_sim": (["--failures", "3", "--gpus", "1000", "--png", ""], 300),
}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.timeout(SMOKE[name][1] + 30))
                                  for name in sorted(SMOKE)])
def test_the_benchmark_runs(name):
    args, timeout = SMOKE[name]
    if name == "groups" and not reconfigure.supported():
        pytest.skip(f"benchmarks/groups.py compares against torch's group reconfigure (torch >= 2.14); "
                    f"this is torch {torch.__version__}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")}
    script = name.split(":")[0]  # "script:case": another way to run the same script
    out = subprocess.run([sys.executable, f"benchmarks/{script}.py", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert "|" in out.stdout, f"{name} printed no table:\n{out.stdout[-2000:]}"
