"""Part 1 of benchmarks/gpu.py: a one-replica fthsdp job against DDP, each on
the device's own backend, in float32 and bfloat16; the checksum; the
checkpoint's staging stall.

    python benchmarks/gpu_step.py [--device cuda|cpu] [--pairs 3] [--steps 40]

Each run is one OS process training fthsdp.examples.gpt (batch 8 x 128,
AdamW) on the device: DDP with world size 1 (NCCL on a GPU, gloo on the
CPU), or fthsdp with its defaults against a real coordinator (a one-replica
quorum: FTAR on NCCL, the commit vote, the straggler and hang reports, the
state checksum every 10 steps). A run's figure is its *throughput step*:
the time of its steps after the first checksum interval, in whole intervals,
between two device synchronizations and none in between, so every host
synchronization fthsdp makes in its step is counted, as DDP's host runs
ahead. Runs alternate DDP and fthsdp, the order flipping each pair.

``--device cpu`` runs the same code without a GPU (gloo both sides): what
tests/test_benchmarks.py runs, so that the GPU run of a lent device
does not fail on the code. One replica sends nothing across replicas: the
cross-replica overlap needs two GPUs and stays unmeasured until two are lent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.step_time import CHECKSUM_EVERY, launch, parse_worker  # noqa: E402

DTYPES = ("float32", "bfloat16")


def train(mode: str, steps: int, model_name: str, init: str) -> None:
    """One run (a worker process): prints its throughput step as JSON. ``model_name``: gpt-<dtype>-<device>."""
    import datetime

    import torch
    import torch.distributed as dist

    from fthsdp.examples.gpt.data import Dataset, corpus
    from fthsdp.examples.gpt.model import GPT, GPTConfig

    _, dtype_name, device_type = model_name.split("-")
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    data = Dataset(corpus(), 128)
    model = GPT(GPTConfig(vocab_size=data.vocab_size)).to(device=device, dtype=getattr(torch, dtype_name))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    whole = (steps // CHECKSUM_EVERY) * CHECKSUM_EVERY

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    marks: dict[int, float] = {}

    def mark(step: int) -> None:
        if step in (CHECKSUM_EVERY, whole):
            sync()
            marks[step] = time.perf_counter()

    def loss_of(net, step: int):
        x, y = data.batch(step, 0, 8)
        return net(x.to(device), y.to(device))[1]

    if mode == "ddp":
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init, rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=120))
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                                        else None)
        for step in range(whole):
            mark(step)
            loss_of(ddp, step).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        mark(whole)
        dist.destroy_process_group()
    else:
        from fthsdp.agent.training.manager import Manager

        ft = Manager.from_env(model, optimizer)  # the defaults; the cross-replica backend follows the device
        ft.start(wait_for_replicas=1)
        while ft.step < whole:
            mark(ft.step)
            loss_of(model, ft.step).backward()
            ft.allreduce_gradients()
            ft.commit()
        mark(whole)
        ft.close()
    print(json.dumps({"step_s": (marks[whole] - marks[CHECKSUM_EVERY]) / (whole - CHECKSUM_EVERY)}), flush=True)


def step_rows(device_type: str, pairs: int, steps: int, dtypes=DTYPES, progress=lambda m: None) -> list[str]:
    """The table's rows: per dtype, each side's median throughput step and the median of the pairs' ratios."""
    rows = []
    for dtype in dtypes:
        name = f"gpt-{dtype}-{device_type}"
        ddp, ft = [], []
        for pair in range(pairs):
            for mode in ("ddp", "fthsdp") if pair % 2 == 0 else ("fthsdp", "ddp"):
                (ddp if mode == "ddp" else ft).append(launch(__file__, mode, 1, steps, name)["step_s"])
            progress(f"step time {dtype}: pair {pair + 1}/{pairs}: DDP {ddp[-1] * 1e3:.2f} ms, "
                     f"fthsdp {ft[-1] * 1e3:.2f} ms")
        ratios = [f / d for f, d in zip(ft, ddp, strict=True)]
        rows.append(f"| {dtype} | {statistics.median(ddp) * 1e3:.2f} ms | {statistics.median(ft) * 1e3:.2f} ms | "
                    f"{statistics.median(ratios):.3f} | {', '.join(f'{r:.3f}' for r in ratios)} |")
    return rows


def checksum_and_staging(device, nbytes: int, trials: int) -> list[str]:
    """The state checksum's time on the training thread (as a multi-rank group
    or a checkpoint step computes it; one rank per replica computes it off the
    step) and a checkpoint share's staging (the training thread's stall) of a
    state of ``nbytes`` on ``device``."""
    import torch

    from fthsdp.agent.training.checkpoint.share import ShareSpec, stage
    from fthsdp.agent.training.state.checksum import state_checksum

    n = nbytes // 8 // 4
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.rand(n, device=device)) for _ in range(8)])
    state = {"model": dict(model.state_dict())}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    checks, stalls = [], []
    for _ in range(trials):
        began = time.perf_counter()
        state_checksum(model)
        checks.append(time.perf_counter() - began)
        began = time.perf_counter()
        stage(state, ShareSpec("bench", 1, 0, 1, 0, 1, 0, 1))
        stalls.append(time.perf_counter() - began)
    mib = nbytes / (1 << 20)
    return [f"| state checksum (CRC-32 on the host, `.cpu()` first) | {mib:.0f} MiB | "
            f"{statistics.median(checks) * 1e3:.1f} ms | {nbytes / statistics.median(checks) / 1e9:.2f} GB/s |",
            f"| checkpoint share staged (`share.stage`, R = 1) | {mib:.0f} MiB | "
            f"{statistics.median(stalls) * 1e3:.1f} ms | {nbytes / statistics.median(stalls) / 1e9:.2f} GB/s |"]


def tables(device, pairs: int, steps: int, state_bytes: int, dtypes=DTYPES, progress=lambda m: None) -> list[str]:
    return [
        "### 1. One replica on the device: fthsdp against DDP, each on the device's backend",
        "",
        f"fthsdp.examples.gpt, batch 8 x 128, AdamW, one process; {pairs} pairs of runs of {steps} steps; each run's "
        f"throughput step over its steps {CHECKSUM_EVERY + 1}-{(steps // CHECKSUM_EVERY) * CHECKSUM_EVERY} "
        "(whole checksum intervals, synchronized only at both ends: fthsdp's host synchronizations count).",
        "",
        "| dtype | DDP, world size 1 (median of runs) | fthsdp, one replica (median of runs) | fthsdp / DDP "
        "(median of pairs) | pair ratios |",
        "|---|---:|---:|---:|---|",
        *step_rows(device.type, pairs, steps, dtypes, progress),
        "",
        "| on the training thread | state | time (median) | rate |",
        "|---|---:|---:|---:|",
        *checksum_and_staging(device, state_bytes, 3),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help=f"at least {2 * CHECKSUM_EVERY}")
    p.add_argument("--state-mib", type=int, default=1024, help="the state checksummed and staged (default 1 GiB)")
    p.add_argument("--dtypes", default=",".join(DTYPES),
                   help="the model's dtypes, comma-separated (default float32,bfloat16; bfloat16 is slow on a CPU)")
    p.add_argument("--model", default="", help=argparse.SUPPRESS)
    args = parse_worker(p, ("ddp", "fthsdp"), argv)
    if args.worker:
        train(args.worker, args.steps, args.model, args.init)
        return 0
    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    if args.steps < 2 * CHECKSUM_EVERY or args.pairs < 1 or not dtypes or set(dtypes) - set(DTYPES):
        p.error(f"give --steps {2 * CHECKSUM_EVERY} or more, --pairs 1 or more and --dtypes among {','.join(DTYPES)}")
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    print("\n".join(tables(device, args.pairs, args.steps, args.state_mib << 20, dtypes,
                           lambda m: print(m, file=sys.stderr, flush=True))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
