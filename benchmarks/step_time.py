"""Step time of the example GPT under fthsdp vs under torch DDP, same world size.

    python benchmarks/step_time.py [--replicas 2] [--pairs 5] [--steps 40]
    python benchmarks/step_time.py --model comm-heavy [--replicas 2] [--pairs 5] [--steps 20]

Each run starts N OS processes (one torch thread each, gloo on loopback)
training fthsdp.examples.gpt for --steps steps; a run's figure is its median step
time after 5 warm-up steps. Runs alternate DDP, fthsdp, DDP, fthsdp... and
the table reports each side's median and the median of the per-pair ratios,
since this machine's run-to-run spread (about 6%) is larger than the effect.
fthsdp runs against a real coordinator (embedded store) with the full
training API with its defaults: FTAR, commit, a state checksum every 10 steps.
The last column is the share of fthsdp's step its commit vote takes (the
small all-reduce after the data all-reduce that makes the commit decision
one for all: fthsdp/agent/training/ftar/vote.py), from ``StepResult.vote_s`` in the same runs.

``--model comm-heavy``: an MLP whose gradients are 100 MB (six 2048x2048
layers, float32), on a small batch, so that the all-reduce takes more of the
step than the computation. Each round then runs three: DDP, fthsdp with its
all-reduce started bucket by bucket during the backward pass (the default,
25 MB buckets), and fthsdp with one all-reduce after the backward pass
(FTHSDP_BUCKET_CAP_MB=0), the overlap's before and after in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WARMUP = 5


COMM_HEAVY_WIDTH, COMM_HEAVY_LAYERS, COMM_HEAVY_BATCH = 2048, 6, 8


class _CommHeavy:
    """The MLP of ``--model comm-heavy`` and its batches, shaped like the GPT example's."""

    def __init__(self) -> None:
        import torch

        layers: list[torch.nn.Module] = []
        for _ in range(COMM_HEAVY_LAYERS):
            layers += [torch.nn.Linear(COMM_HEAVY_WIDTH, COMM_HEAVY_WIDTH), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers)

    def batch(self, step: int, rank: int, _size: int):
        import torch

        g = torch.Generator().manual_seed(step * 1000 + rank)
        return (torch.randn(COMM_HEAVY_BATCH, COMM_HEAVY_WIDTH, generator=g),
                torch.randn(COMM_HEAVY_BATCH, COMM_HEAVY_WIDTH, generator=g))


def build(model_name: str):
    """(model, data, forward): forward(model, x, y) returns the loss."""
    import torch

    torch.manual_seed(0)
    if model_name == "comm-heavy":
        heavy = _CommHeavy()
        return heavy.net, heavy, lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    from fthsdp.examples.gpt.data import Dataset, corpus
    from fthsdp.examples.gpt.model import GPT, GPTConfig

    data = Dataset(corpus(), 128)
    return GPT(GPTConfig(vocab_size=data.vocab_size)), data, lambda m, x, y: m(x, y)[1]


def train(mode: str, rank: int, world: int, init: str, steps: int, model_name: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    model, data, forward = build(model_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times: list[float] = []
    votes: list[float] = []
    """fthsdp: each step's commit vote (fthsdp/agent/training/ftar/vote.py), in seconds."""
    if mode == "ddp":
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for step in range(steps):
            start = time.perf_counter()
            x, y = data.batch(step, rank, 8)
            loss = forward(ddp, x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
        dist.destroy_process_group()
    else:
        from fthsdp.agent.training.manager import Manager

        ft = Manager.from_env(model, optimizer)  # the defaults, a checksum every 10 steps included
        ft.start(wait_for_replicas=world)
        while ft.step < steps:
            start = time.perf_counter()
            x, y = data.batch(ft.step, ft.replica_rank, 8)
            loss = forward(model, x, y)
            loss.backward()
            result = ft.allreduce_gradients()
            ft.commit()  # the default update: optimizer.step(), zero_grad
            times.append(time.perf_counter() - start)
            votes.append(result.vote_s if result is not None else 0.0)
        ft.close()
    if rank == 0:
        print(json.dumps({"times": times, "votes": votes}), flush=True)
    os._exit(0)


def run(mode: str, world: int, steps: int, model_name: str = "gpt") -> float:
    """One run's median step time; ``mode``: ddp, fthsdp, or fthsdp-flat (no overlap)."""
    return run_both(mode, world, steps, model_name)[0]


def run_both(mode: str, world: int, steps: int, model_name: str = "gpt") -> tuple[float, float]:
    """One run's median step time and median commit vote (0 for DDP)."""
    from fthsdp.testing.local_etcd import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    coordinator = None
    if mode.startswith("fthsdp"):
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", str(world)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT,
        )
        address = coordinator.stdout.readline().split("listening on ")[1].split()[0]
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank in range(world):
        renv = dict(env)
        if mode.startswith("fthsdp"):
            renv.update(FTHSDP_COORDINATOR=address, FTHSDP_REPLICA_ID=f"r{rank}", FTHSDP_REPLICA_RANK=str(rank),
                        FTHSDP_NUM_REPLICAS=str(world))
        if mode == "fthsdp-flat":
            renv["FTHSDP_BUCKET_CAP_MB"] = "0"
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", mode.split("-")[0], "--rank", str(rank), "--world", str(world),
             "--init", init, "--steps", str(steps), "--model", model_name],
            stdout=subprocess.PIPE, text=True, env=renv, cwd=ROOT,
        ))
    out = json.loads(procs[0].communicate(timeout=1800)[0].strip().splitlines()[-1])
    for p in procs[1:]:
        p.wait(timeout=120)
    if coordinator is not None:
        coordinator.terminate()
        coordinator.wait(timeout=30)
    return statistics.median(out["times"][WARMUP:]), statistics.median(out["votes"][WARMUP:] or [0.0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--model", choices=("gpt", "comm-heavy"), default="gpt",
                   help="comm-heavy: 100 MB of gradients on a small batch, with and without overlap")
    p.add_argument("--worker", choices=("ddp", "fthsdp"), help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--init", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        train(args.worker, args.rank, args.world, args.init, args.steps, args.model)
        return
    if args.model == "comm-heavy":
        comm_heavy(args.replicas, args.pairs, args.steps)
        return
    ddp, ft, votes = [], [], []
    for _ in range(args.pairs):
        ddp.append(run("ddp", args.replicas, args.steps))
        step, vote = run_both("fthsdp", args.replicas, args.steps)
        ft.append(step)
        votes.append(vote / step)
    ratios = [f / d for f, d in zip(ft, ddp, strict=True)]
    print("| replicas | DDP step (median of runs) | fthsdp step (median of runs) | fthsdp / DDP (median of pairs) |"
          " pair ratios | commit vote / fthsdp step (median of runs) |")
    print("|---:|---:|---:|---:|---|---:|")
    print(
        f"| {args.replicas} | {statistics.median(ddp) * 1e3:.1f} ms | {statistics.median(ft) * 1e3:.1f} ms | "
        f"{statistics.median(ratios):.3f} | {', '.join(f'{r:.3f}' for r in ratios)} | "
        f"{statistics.median(votes):.4f} |"
    )


def comm_heavy(replicas: int, rounds: int, steps: int) -> None:
    """Rounds of DDP, fthsdp (overlapped) and fthsdp with one all-reduce after the backward pass, interleaved."""
    ddp, ft, flat, votes = [], [], [], []
    for _ in range(rounds):
        ddp.append(run("ddp", replicas, steps, "comm-heavy"))
        step, vote = run_both("fthsdp", replicas, steps, "comm-heavy")
        ft.append(step)
        votes.append(vote / step)
        flat.append(run("fthsdp-flat", replicas, steps, "comm-heavy"))

    def ratio(a: list[float], b: list[float]) -> str:
        pairs = [x / y for x, y in zip(a, b, strict=True)]
        return f"{statistics.median(pairs):.3f} ({', '.join(f'{r:.2f}' for r in pairs)})"

    gradients = COMM_HEAVY_LAYERS * (COMM_HEAVY_WIDTH + 1) * COMM_HEAVY_WIDTH * 4 / 1e6
    print(f"comm-heavy: {gradients:.0f} MB of gradients, batch {COMM_HEAVY_BATCH}, {replicas} replicas, "
          f"{rounds} rounds of {steps} steps")
    print("| DDP step | fthsdp step (overlapped) | fthsdp step (one all-reduce after backward) | "
          "fthsdp / DDP | fthsdp no overlap / DDP | overlapped / no overlap |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {statistics.median(ddp) * 1e3:.0f} ms | {statistics.median(ft) * 1e3:.0f} ms | "
          f"{statistics.median(flat) * 1e3:.0f} ms | {ratio(ft, ddp)} | {ratio(flat, ddp)} | {ratio(ft, flat)} |")
    print(f"commit vote / fthsdp step (overlapped), median of runs: {statistics.median(votes):.4f}")


if __name__ == "__main__":
    main()
