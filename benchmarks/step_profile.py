"""Where a step's time goes, fthsdp against DDP in the same run, phase by phase.

    python benchmarks/step_profile.py [--model comm-heavy|gpt|both] [--rounds 3] [--steps 40] [--replicas 2]

The same runs as benchmarks/step_time.py (N OS processes, one torch thread
each, gloo on loopback; fthsdp against a real coordinator with its
defaults), with rank 0 under ``torch.profiler`` for the steps after the
first checksum interval, in whole checksum intervals. fthsdp marks its
phases with ``torch.profiler.record_function`` (``fthsdp.*``: they show in
any profile of a script that trains with it); the loop here marks its own
(``bench.*``). Each phase is its time per step, summed over the profiled
steps and divided by their number, the median over --rounds runs of each
side, alternating DDP and fthsdp.

Phases (an indented phase is part of the one above it):

- forward, backward: the script's. Under DDP the backward pass includes
  DDP's hooks, its bucket copies and the wait for its all-reduces; under
  fthsdp it includes the hooks that copy and start the buckets.
- fthsdp's ``allreduce_gradients()``: the wait for the data (the buckets
  not finished in the backward pass), the tail (batch-norm statistics and
  control slots, summed after the buckets), the commit vote, the gradients
  copied back and divided; "other" is the rest (the inputs recorded, the
  buckets the backward pass left, FTAR's control).
- fthsdp's ``commit()``: the wait for the periodic checksum computed off the
  training thread since the last boundary (fthsdp/agent/training/step/background_checksum.py),
  the update (the optimizer: DDP's optimizer line), the group's max (with
  one rank per replica, no collective), the state checksum on the training
  thread (only where it is not computed off it), a checkpoint, and the rest.

The profiler adds its own cost to every operator (both sides alike), so the
step totals here are above step_time.py's; compare the phases, not the
totals, with that benchmark.
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

from benchmarks.step_time import CHECKSUM_EVERY, build, launch, parse_worker  # noqa: E402

PHASES = [
    ("step", "the step (wall clock)", 0),
    ("bench.forward", "forward", 1),
    ("bench.backward", "backward", 1),
    ("fthsdp.bucket_start", "bucket copies and starts (fthsdp's hooks; some after the backward pass)", 2),
    ("fthsdp.allreduce_gradients", "allreduce_gradients()", 1),
    ("fthsdp.wait_data", "wait for the data", 2),
    ("fthsdp.wait_tail", "wait for the tail", 2),
    ("fthsdp.vote", "commit vote", 2),
    ("fthsdp.gradients_back", "gradients back (divide, copy)", 2),
    ("allreduce other", "other", 2),
    ("fthsdp.commit", "commit()", 1),
    ("bench.optimizer", "optimizer step, zero_grad (DDP)", 1),
    ("fthsdp.checksum_settle", "the checksum computed off the step: waited for, reported", 2),
    ("fthsdp.update", "update (the optimizer)", 2),
    ("fthsdp.group_max", "the group's max", 2),
    ("fthsdp.checksum", "state checksum", 2),
    ("fthsdp.checkpoint", "checkpoint", 2),
    ("commit other", "other", 2),
    ("outside", "outside these (the batch, the loop)", 1),
]
"""(key, what the table calls it, indent)."""


def train(mode: str, rank: int, world: int, init: str, steps: int, model_name: str) -> None:
    """One rank of one run: rank 0 prints each phase's total seconds and the profiled steps, as JSON."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    model, data, forward = build(model_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    whole = (steps // CHECKSUM_EVERY) * CHECKSUM_EVERY
    prof = profile(activities=[ProfilerActivity.CPU])
    wall = 0.0

    def one_step(step: int, body) -> None:
        nonlocal wall
        if step == CHECKSUM_EVERY:
            prof.start()
        start = time.perf_counter()
        body(step)
        if CHECKSUM_EVERY <= step < whole:
            wall += time.perf_counter() - start
        if step == whole - 1:
            prof.stop()

    if mode == "ddp":
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        ddp = torch.nn.parallel.DistributedDataParallel(model)

        def ddp_step(step: int) -> None:
            x, y = data.batch(step, rank, 8)
            with record_function("bench.forward"):
                loss = forward(ddp, x, y)
            with record_function("bench.backward"):
                loss.backward()
            with record_function("bench.optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        for step in range(whole):
            one_step(step, ddp_step)
        dist.destroy_process_group()
    else:
        from fthsdp.agent.training.manager import Manager

        ft = Manager.from_env(model, optimizer)
        ft.start(wait_for_replicas=world)

        def ft_step(step: int) -> None:
            x, y = data.batch(step, ft.replica_rank, 8)
            with record_function("bench.forward"):
                loss = forward(model, x, y)
            with record_function("bench.backward"):
                loss.backward()
            ft.allreduce_gradients()
            ft.commit()

        while ft.step < whole:
            one_step(ft.step, ft_step)
        ft.close()
    if rank == 0:
        totals: dict[str, float] = {}
        for event in prof.key_averages():
            if event.key.startswith(("bench.", "fthsdp.")):
                totals[event.key] = event.cpu_time_total / 1e6
        print(json.dumps({"totals": totals, "wall": wall, "steps": whole - CHECKSUM_EVERY}), flush=True)


def per_step(out: dict) -> dict[str, float]:
    """Each phase's seconds per profiled step, with the derived ones ("other", "outside")."""
    t = {k: v / out["steps"] for k, v in out["totals"].items()}
    t["step"] = out["wall"] / out["steps"]
    parts = ("fthsdp.wait_data", "fthsdp.wait_tail", "fthsdp.vote", "fthsdp.gradients_back")
    if "fthsdp.allreduce_gradients" in t:
        t["allreduce other"] = t["fthsdp.allreduce_gradients"] - sum(t.get(k, 0.0) for k in parts)
    if "fthsdp.commit" in t:
        inside = ("fthsdp.checksum_settle", "fthsdp.update", "fthsdp.group_max", "fthsdp.checksum",
                  "fthsdp.checkpoint")
        t["commit other"] = t["fthsdp.commit"] - sum(t.get(k, 0.0) for k in inside)
    top = ("bench.forward", "bench.backward", "fthsdp.allreduce_gradients", "fthsdp.commit", "bench.optimizer")
    t["outside"] = t["step"] - sum(t.get(k, 0.0) for k in top)
    return t


def table(ddp: list[dict[str, float]], ft: list[dict[str, float]]) -> str:
    def cell(runs: list[dict[str, float]], key: str) -> float | None:
        values = [r[key] for r in runs if key in r]
        return statistics.median(values) if values else None

    rows = ["| phase | DDP, ms per step | fthsdp, ms per step | fthsdp - DDP |", "|---|---:|---:|---:|"]
    same = {"bench.optimizer": "fthsdp.update"}
    """DDP's optimizer line and fthsdp's update are the same work."""
    for key, name, indent in PHASES:
        d, f = cell(ddp, key), cell(ft, key)
        if d is None and f is None:
            continue
        theirs = cell(ft, same[key]) if key in same else f
        diff = f"{(theirs - d) * 1e3:+.1f}" if d is not None and theirs is not None else ""
        label = "&nbsp;" * 4 * indent + name
        rows.append(f"| {label} | {'' if d is None else f'{d * 1e3:.1f}'} | "
                    f"{'' if f is None else f'{f * 1e3:.1f}'} | {diff} |")
    return "\n".join(rows)


def profile_model(model_name: str, rounds: int, steps: int, world: int) -> str:
    ddp, ft = [], []
    for i in range(rounds):
        for mode in ("ddp", "fthsdp") if i % 2 == 0 else ("fthsdp", "ddp"):
            (ddp if mode == "ddp" else ft).append(per_step(launch(__file__, mode, world, steps, model_name)))
        print(f"{model_name} round {i + 1}/{rounds}: DDP {ddp[-1]['step'] * 1e3:.0f} ms, "
              f"fthsdp {ft[-1]['step'] * 1e3:.0f} ms", file=sys.stderr, flush=True)
    window = (steps // CHECKSUM_EVERY - 1) * CHECKSUM_EVERY
    return (f"{model_name}: {world} replicas, {rounds} rounds, rank 0 profiled over steps {CHECKSUM_EVERY + 1}-"
            f"{CHECKSUM_EVERY + window} ({window // CHECKSUM_EVERY} checksum intervals); medians of runs\n\n"
            + table(ddp, ft))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("comm-heavy", "gpt", "both"), default="both",
                   help="comm-heavy: 100 MB of gradients; gpt: the example (default both)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating (default 3)")
    p.add_argument("--steps", type=int, default=40,
                   help=f"steps per run, at least {2 * CHECKSUM_EVERY}; the first {CHECKSUM_EVERY} are not profiled")
    p.add_argument("--replicas", type=int, default=2, help="processes, one replica of one rank each (default 2)")
    args = parse_worker(p, ("ddp", "fthsdp"), argv)
    if args.worker:
        train(args.worker, args.rank, args.world, args.init, args.steps, args.model)
        return 0
    if args.steps < 2 * CHECKSUM_EVERY or args.rounds < 1 or args.replicas < 2:
        p.error(f"give --steps {2 * CHECKSUM_EVERY} or more, --rounds 1 or more and --replicas 2 or more")
    models = ("comm-heavy", "gpt") if args.model == "both" else (args.model,)
    for name in models:
        print(profile_model(name, args.rounds, args.steps, args.replicas) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
