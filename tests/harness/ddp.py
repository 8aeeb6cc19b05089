"""The DDP-equivalence oracle: torch's own DistributedDataParallel on N ranks,
and fthsdp replicas trained side by side with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from tests.harness.processes import ROOT, CoordinatorProcess, WorkerProcess, _env

N, STEPS, HIDDEN = 3, 12, "96"


def train_with_ddp_and_fthsdp(tmp_path, worker_args: tuple[str, ...], env: dict[str, str]):
    """N ranks of torch DDP and N fthsdp replicas, the same model and data;
    (DDP's final parameters, each replica's)."""
    oracle = start_ddp_oracle(tmp_path, N, "--steps", str(STEPS), "--hidden", HIDDEN, *worker_args)
    coordinator = CoordinatorProcess(tmp_path, "--min-replicas", str(N)).start()
    try:
        workers = [
            WorkerProcess(tmp_path, coordinator.address, f"r{r}", r, "--steps", str(STEPS), "--wait-for", str(N),
                          "--hidden", HIDDEN, *worker_args, "--save", str(tmp_path / f"ft{r}.pt"), env=env).start()
            for r in range(N)
        ]
        for w in workers:
            w.finish()
    finally:
        coordinator.stop()
    for p in oracle:
        assert p.wait(timeout=120) == 0
    expected = torch.load(tmp_path / "ddp0.pt", weights_only=True)
    return expected, [torch.load(tmp_path / f"ft{r}.pt", weights_only=True) for r in range(N)]


def start_ddp_oracle(tmp: Path, world: int, *args: str, worker: str = "tests.ddp_worker",
                     log: bool = False) -> list[subprocess.Popen]:
    """``python -m worker`` on ``world`` ranks of torch DDP, the oracle of the
    equivalence tests: tests/ddp_worker.py (tests/ftar_worker.py's model) or
    tests/nanogpt_ddp_worker.py (examples/nanogpt's loop), with ``args`` the
    flags that shape training. Rank r saves its final parameters to
    tmp/ddp{r}.pt; with ``log`` its stderr goes to tmp/ddp{r}.log (for the
    caller to quote) instead of the test's own."""
    init = f"file://{tmp / 'ddp-rendezvous'}"  # a file: no free-port race with other tests
    return [
        subprocess.Popen(
            [sys.executable, "-m", worker, "--rank", str(r), "--world", str(world), "--init", init,
             "--save", str(tmp / f"ddp{r}.pt"), *args],
            cwd=ROOT, env=_env(), stderr=open(tmp / f"ddp{r}.log", "ab") if log else None,
        )
        for r in range(world)
    ]
