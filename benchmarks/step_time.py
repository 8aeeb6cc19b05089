"""Step time of a model under fthsdp vs under torch DDP, same world size, same run.

    python benchmarks/step_time.py [--model gpt|comm-heavy] [--replicas 2] [--pairs 8] [--steps 40] [--flat]
                                   [--bucket-caps MB[,MB...]]

Each run starts N OS processes (one torch thread each, gloo on loopback)
training the model for --steps steps. A round runs, in turn, DDP (its
defaults), DDP with ``gradient_as_bucket_view=True`` and fthsdp with its
defaults (FTAR overlapped with the backward pass, the commit vote, the
straggler and hang reports, a state checksum every 10 steps), against a real
coordinator; with ``--flat`` also fthsdp with one all-reduce after the
backward pass (FTHSDP_BUCKET_CAP_MB=0), and with ``--bucket-caps`` fthsdp
with other bucket caps (comm-heavy's weights are 16.8 MB each: fthsdp's
default 25 MB cap sends one per bucket, 35 MB two, as DDP's buckets, which
it fills past its 25 MB cap, hold). Rounds alternate their order (A B C,
C B A, ...), so that a drift of the machine falls on every side alike.

Two figures per run, both from the steps after the first checksum interval
(10 steps: the warm-up):

- **throughput step**: the mean step over whole checksum intervals, so a
  cost that comes every N steps (the checksum) counts at its share;
- **median step**: what a typical step costs, the periodic costs left out.

Each ratio to DDP is computed per round (both runs of the round), and the
table gives the geometric mean of the rounds' ratios with a 95% interval
(Student's t on the logs of the ratios): this machine's run-to-run spread is
larger than the effects measured, and the interval says how far to trust
one. The last column is the share of fthsdp's step its commit vote takes
(``StepResult.vote_s``: from the member's sum completing to the decision).

``--model comm-heavy``: an MLP whose gradients are 100 MB (six 2048x2048
layers, float32), on a small batch, so that the all-reduce takes more of the
step than the computation. ``--model gpt``: fthsdp.examples.gpt (3.2M
parameters, batch 8, sequence 128).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHECKSUM_EVERY = 10
"""fthsdp's default (``checksum_every``): the interval the throughput figure averages whole."""

COMM_HEAVY_WIDTH, COMM_HEAVY_LAYERS, COMM_HEAVY_BATCH = 2048, 6, 8

MODES = {
    "ddp": "DDP",
    "ddp-view": "DDP, gradient_as_bucket_view",
    "fthsdp": "fthsdp (defaults)",
    "fthsdp-flat": "fthsdp, one all-reduce after backward",
}

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Student's t, two-sided 95%, by degrees of freedom 1..30 (1.96 beyond)."""


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
    """One rank of one run: prints (rank 0) each step's time and commit vote as JSON."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    model, data, forward = build(model_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times: list[float] = []
    votes: list[float] = []
    if mode.startswith("ddp"):
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=mode == "ddp-view")
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


def measured(times: list[float]) -> list[float]:
    """The steps after the warm-up interval, in whole checksum intervals.

    Step ``i`` (0-based) ends with the commit of step i+1; the checksum is
    taken at commits that are multiples of CHECKSUM_EVERY, so the steps
    CHECKSUM_EVERY .. CHECKSUM_EVERY * k - 1 hold k - 1 whole intervals with
    one checksum each."""
    whole = (len(times) // CHECKSUM_EVERY) * CHECKSUM_EVERY
    return times[CHECKSUM_EVERY:whole]


def launch(script: str, mode: str, world: int, steps: int, model_name: str) -> dict:
    """Run ``script --worker mode`` as ``world`` processes (against a real
    coordinator for fthsdp) and return what its rank 0 printed last, as JSON."""
    from fthsdp.testing.local_etcd import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_")}
    env["PYTHONPATH"] = str(ROOT)
    coordinator = None
    if mode.startswith("fthsdp"):
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", str(world)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT,
        )
        assert coordinator.stdout is not None
        address = coordinator.stdout.readline().split("listening on ")[1].split()[0]
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = []
    try:
        for rank in range(world):
            renv = dict(env)
            if mode.startswith("fthsdp"):
                renv.update(FTHSDP_COORDINATOR=address, FTHSDP_REPLICA_ID=f"r{rank}",
                            FTHSDP_REPLICA_RANK=str(rank), FTHSDP_NUM_REPLICAS=str(world))
            if mode == "fthsdp-flat":
                renv["FTHSDP_BUCKET_CAP_MB"] = "0"
            elif mode.startswith("fthsdp-cap-"):
                renv["FTHSDP_BUCKET_CAP_MB"] = mode.removeprefix("fthsdp-cap-")
            procs.append(subprocess.Popen(
                [sys.executable, script, "--worker", mode, "--rank", str(rank), "--world", str(world),
                 "--init", init, "--steps", str(steps), "--model", model_name],
                stdout=subprocess.PIPE, text=True, env=renv, cwd=ROOT,
            ))
        stdout = procs[0].communicate(timeout=1800)[0]
        for p in procs[1:]:
            p.wait(timeout=120)
        if any(p.returncode for p in procs):
            raise SystemExit(f"{Path(script).name}: a {mode} rank failed (exit codes {[p.returncode for p in procs]})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if coordinator is not None:
            coordinator.terminate()
            coordinator.wait(timeout=30)
    return json.loads(stdout.strip().splitlines()[-1])


def run(mode: str, world: int, steps: int, model_name: str) -> dict[str, float]:
    """One run: its throughput step, median step and median commit vote (0 for DDP), in seconds."""
    out = launch(__file__, mode, world, steps, model_name)
    window = measured(out["times"])
    votes = measured(out["votes"]) or [0.0]
    return {"throughput": statistics.fmean(window), "median": statistics.median(window),
            "vote": statistics.median(votes)}


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """The geometric mean of ``ratios`` and its 95% interval (t on the logs)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    t = T_975[len(logs) - 2] if len(logs) - 1 <= len(T_975) else 1.96
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def ratio_cell(ratios: list[float]) -> str:
    g, lo, hi = interval(ratios)
    return f"{g:.3f} [{lo:.3f}, {hi:.3f}]" if not math.isnan(lo) else f"{g:.3f}"


def rounds(modes: list[str], pairs: int, world: int, steps: int, model_name: str) -> dict[str, list[dict]]:
    """``pairs`` rounds of every mode, the order reversed every other round."""
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for i in range(pairs):
        for mode in modes if i % 2 == 0 else reversed(modes):
            runs[mode].append(run(mode, world, steps, model_name))
        print(f"round {i + 1}/{pairs}: " + ", ".join(
            f"{m} {runs[m][-1]['throughput'] * 1e3:.0f} ms" for m in modes), file=sys.stderr, flush=True)
    return runs


def table(runs: dict[str, list[dict]]) -> str:
    base = runs["ddp"]
    rows = ["| run | throughput step (median of runs) | median step (median of runs) | / DDP, throughput "
            "(geo. mean [95% interval]) | / DDP, median step | commit vote / step |",
            "|---|---:|---:|---:|---:|---:|"]
    for mode, rs in runs.items():
        through = [r["throughput"] / b["throughput"] for r, b in zip(rs, base, strict=True)]
        median = [r["median"] / b["median"] for r, b in zip(rs, base, strict=True)]
        vote = statistics.median(r["vote"] / r["median"] for r in rs) if mode.startswith("fthsdp") else None
        rows.append(
            f"| {label(mode)} | {statistics.median(r['throughput'] for r in rs) * 1e3:.1f} ms | "
            f"{statistics.median(r['median'] for r in rs) * 1e3:.1f} ms | "
            f"{'1' if mode == 'ddp' else ratio_cell(through)} | {'1' if mode == 'ddp' else ratio_cell(median)} | "
            f"{f'{vote:.4f}' if vote is not None else '-'} |")
    return "\n".join(rows)


def label(mode: str) -> str:
    if mode.startswith("fthsdp-cap-"):
        return f"fthsdp, buckets of at most {mode.removeprefix('fthsdp-cap-')} MB"
    return MODES[mode]


def parse_worker(p: argparse.ArgumentParser, modes: tuple[str, ...] | None, argv: list[str] | None
                 ) -> argparse.Namespace:
    """Parse with the hidden arguments that ``launch`` gives a worker process."""
    p.add_argument("--worker", choices=modes, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--init", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2, help="processes, one replica of one rank each (default 2)")
    p.add_argument("--pairs", type=int, default=8, help="rounds of every mode, interleaved (default 8)")
    p.add_argument("--steps", type=int, default=40,
                   help=f"steps per run, at least {2 * CHECKSUM_EVERY}: the first {CHECKSUM_EVERY} warm up "
                        "(default 40)")
    p.add_argument("--model", choices=("gpt", "comm-heavy"), default="gpt",
                   help="comm-heavy: 100 MB of gradients on a small batch (default gpt: the example)")
    p.add_argument("--flat", action="store_true", help="also fthsdp with one all-reduce after the backward pass")
    p.add_argument("--bucket-caps", default="",
                   help="also fthsdp with these bucket caps, in MB, comma-separated (default: none)")
    args = parse_worker(p, None, argv)
    if args.worker and args.worker not in MODES and not args.worker.startswith("fthsdp-cap-"):
        p.error(f"unknown worker mode {args.worker!r}")
    if args.worker:
        train(args.worker, args.rank, args.world, args.init, args.steps, args.model)
        return 0
    if args.steps < 2 * CHECKSUM_EVERY or args.pairs < 1 or args.replicas < 2:
        p.error(f"give --steps {2 * CHECKSUM_EVERY} or more, --pairs 1 or more and --replicas 2 or more")
    try:
        caps = [float(c) for c in args.bucket_caps.split(",") if c.strip()]
    except ValueError:
        p.error(f"--bucket-caps takes numbers of MB, comma-separated, got {args.bucket_caps!r}")
    if any(not 0 < c <= 1 << 20 for c in caps):
        p.error("--bucket-caps: each cap must be above 0 and at most 1048576 MB")
    modes = (["ddp", "ddp-view", "fthsdp"] + (["fthsdp-flat"] if args.flat else [])
             + [f"fthsdp-cap-{c:g}" for c in caps])
    runs = rounds(modes, args.pairs, args.replicas, args.steps, args.model)
    window = (args.steps // CHECKSUM_EVERY - 1) * CHECKSUM_EVERY
    print(f"{args.model}: {args.replicas} replicas, {args.pairs} rounds of {args.steps} steps; each run's figures "
          f"from its steps {CHECKSUM_EVERY + 1}-{CHECKSUM_EVERY + window} ({window // CHECKSUM_EVERY} whole "
          "checksum intervals)")
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
