"""benchmarks/gpu.py, the prepared GPU run, stays runnable on machines without one.

It runs only where a GPU is lent, rarely and briefly, so a part broken by a
change elsewhere would be found only there. Here: without a GPU it exits at
once with one line; and its parts that do not need CUDA to work at all
(the transports, the snapshot's copy, catch-up over HTTP) run on CPU tensors
at small sizes and print their tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script runs for real")
def test_without_a_gpu_it_exits_at_once_with_one_line():
    out = _run(["benchmarks/gpu.py", "--quick"], timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"benchmarks/gpu.py needs a CUDA GPU: torch.cuda.is_available() is False (this torch: {torch.__version__})"
    ]


PARTS_ON_CPU = """
import sys
sys.path.insert(0, ".")
import torch
from benchmarks.gpu import transports
from benchmarks.gpu_catchup import catchup_http, snapshot_copy

cpu = torch.device("cpu")
for lines in (transports(cpu, [1]), snapshot_copy(cpu, 8 << 20, 1), catchup_http(cpu, 8 << 20, 1)):
    print("\\n".join(lines))
"""


@pytest.mark.timeout(120)
def test_its_parts_run_on_cpu_tensors():
    out = _run(["-c", PARTS_ON_CPU], timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    for title in ("### 2. The cross-replica transports", "### 3. The snapshot's copy", "### 4. Catch-up"):
        assert title in out.stdout, out.stdout[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| gloo | float32 | 1 MB |")]
    assert len(rows) == 1 and "failed" not in rows[0], out.stdout[-3000:]
    assert "| HTTP (`CatchUpServer` → `SourceClient`)" in out.stdout, out.stdout[-3000:]
