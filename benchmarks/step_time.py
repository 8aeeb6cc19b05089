"""Step time of the example GPT under fthsdp vs under torch DDP, same world size.

    python benchmarks/step_time.py [--replicas 2] [--pairs 5] [--steps 40]

Each run starts N OS processes (one torch thread each, gloo on loopback)
training fthsdp.examples.gpt for --steps steps; a run's figure is its median step
time after 5 warm-up steps. Runs alternate DDP, fthsdp, DDP, fthsdp... and
the table reports each side's median and the median of the per-pair ratios,
since this machine's run-to-run spread (about 6%) is larger than the effect.
fthsdp runs against a real coordinator (embedded store) with the full
training API with its defaults: FTAR, commit, a state checksum every 10 steps.
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


def train(mode: str, rank: int, world: int, init: str, steps: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from fthsdp.examples.gpt.data import Dataset, corpus
    from fthsdp.examples.gpt.model import GPT, GPTConfig

    torch.set_num_threads(1)
    data = Dataset(corpus(), 128)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    if mode == "ddp":
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for step in range(steps):
            start = time.perf_counter()
            x, y = data.batch(step, rank, 8)
            _, loss = ddp(x, y)
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
            _, loss = model(x, y)
            loss.backward()
            ft.allreduce_gradients()
            ft.commit()  # the default update: optimizer.step(), zero_grad
            times.append(time.perf_counter() - start)
        ft.close()
    if rank == 0:
        print(json.dumps(times), flush=True)
    os._exit(0)


def run(mode: str, world: int, steps: int) -> float:
    from fthsdp.testing.local_etcd import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    coordinator = None
    if mode == "fthsdp":
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", str(world)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT,
        )
        address = coordinator.stdout.readline().split("listening on ")[1].split()[0]
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    for rank in range(world):
        renv = dict(env)
        if mode == "fthsdp":
            renv.update(FTHSDP_COORDINATOR=address, FTHSDP_REPLICA_ID=f"r{rank}", FTHSDP_REPLICA_RANK=str(rank),
                        FTHSDP_NUM_REPLICAS=str(world))
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", mode, "--rank", str(rank), "--world", str(world),
             "--init", init, "--steps", str(steps)],
            stdout=subprocess.PIPE, text=True, env=renv, cwd=ROOT,
        ))
    times = json.loads(procs[0].communicate(timeout=1800)[0].strip().splitlines()[-1])
    for p in procs[1:]:
        p.wait(timeout=120)
    if coordinator is not None:
        coordinator.terminate()
        coordinator.wait(timeout=30)
    return statistics.median(times[WARMUP:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--worker", choices=("ddp", "fthsdp"), help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--init", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        train(args.worker, args.rank, args.world, args.init, args.steps)
        return
    ddp, ft = [], []
    for _ in range(args.pairs):
        ddp.append(run("ddp", args.replicas, args.steps))
        ft.append(run("fthsdp", args.replicas, args.steps))
    ratios = [f / d for f, d in zip(ft, ddp, strict=True)]
    print("| replicas | DDP step (median of runs) | fthsdp step (median of runs) | fthsdp / DDP (median of pairs) |"
          " pair ratios |")
    print("|---:|---:|---:|---:|---|")
    print(
        f"| {args.replicas} | {statistics.median(ddp) * 1e3:.1f} ms | {statistics.median(ft) * 1e3:.1f} ms | "
        f"{statistics.median(ratios):.3f} | {', '.join(f'{r:.3f}' for r in ratios)} |"
    )


if __name__ == "__main__":
    main()
