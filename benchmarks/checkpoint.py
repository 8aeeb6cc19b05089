"""Durable checkpoints: save time with R replicas sharing the write, the
members' step time with a checkpoint every K steps, and restore time
against state size.

    python benchmarks/checkpoint.py [--mib 256] [--trials 5] [--dir DIR]
        [--hidden 1024] [--replicas 3] [--every 10] [--intervals 10] [--pairs 5]
        [--restore-mib 8,64,256] [--skip-save] [--skip-steps] [--skip-restore]

1. Save. R writers (R = 1, 2, 3) are separate OS processes (multiprocessing
   'spawn'), each holding an identical copy of one state (a stack of 8
   square Linear layers and their AdamW state after one step, built from
   the same seed; --mib MiB in all). Every trial writes into a fresh folder
   under --dir: the writers are started together (each arms, then waits on
   one shared event) and each stages (``share.stage``: a host copy of its
   1/R) and writes (``share.write``: DCP ``no_dist``, fsync, a CRC-32 of
   every 4 MiB block of each data file, computed as it is written) its
   share into the same step folder; then this process seals them
   (``seal.seal``). Baseline, same run, same state, same storage: one
   writer process's ``torch.distributed.checkpoint.save(state_dict,
   checkpoint_id=..., no_dist=True)`` of ``{"model": model.state_dict(),
   "optimizer": optimizer.state_dict()}`` (DCP's defaults: one file per rank,
   fsync, one writer thread, no checksums). The order of the four kinds
   rotates from trial to trial, and ``os.sync()`` runs (untimed) before
   each; the table gives medians over --trials.
   "Writers" = from the start event to the last writer's share written
   (stage included); total = writers + seal. Target: total(R) / total(1)
   within 20% of 1/R.
2. Step time. A coordinator and --replicas workers (tests/ftar_worker.py
   through tests/harness/processes.py, a 2-layer MLP of --hidden, AdamW, one torch
   thread each, gloo on loopback) train once with FTHSDP_CHECKPOINT_EVERY=K
   (each member writes 1/R of each checkpoint in the background, one of
   them seals) and once without; both with the library's default state
   checksum every 10 steps. From the workers' own per-step timestamps: the
   mean step time over --intervals whole checkpoint intervals after one
   interval of warm-up (each checkpoint's staging and background write fall
   inside exactly once). Runs alternate none / checkpointed, --pairs pairs;
   reported: each side's median and the median of the per-pair ratios.
   Target: ratio <= 1.02.
3. Restore. For each size in --restore-mib: the state written as 2 shares
   (stage + write each, this process) and sealed; then timed: ``seal.read_checkpoint``
   + ``restore.load`` (DCP load into new tensors, every block checked
   against its digest as DCP reads it) + ``TrainState.load`` into a fresh TrainState of the
   same model (other values). Baseline, same state and bytes: DCP's own
   ``save`` of it, then ``torch.distributed.checkpoint.load`` in place into a
   fresh model's and optimizer's state dicts and their ``load_state_dict``.
   The restored state's checksums are compared with the source's, and
   ``seal.verify_files`` (the same check as a pass of its own, as restores
   made it before checking while reading) is timed apart (neither in the
   total).

This machine cannot drop the page cache: every read in part 3 comes from
it, and writes land in it too (``fsync`` then pushes them to the disk, if
--dir is on a real disk; on tmpfs, e.g. --dir /dev/shm/x, fsync is a no-op
and part 1 measures the CPU's share of a save alone). The R writers of
part 1 share this machine's cores and its one disk, where real replicas
each have their own.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

JOB, STEP, STRUCTURE, QUORUM = "bench", 100, 4242, 1
LAYERS = 8
MIB = 2**20


def _quiet() -> None:
    warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


# ----- the state ------------------------------------------------------------------------


def make_state(mib: float, seed: int):
    """A TrainState of LAYERS square Linear layers and AdamW after one step: about ``mib`` MiB."""
    import torch

    from fthsdp.agent.training.state.train_state import TrainState

    width = max(8, round((mib * MIB / (12 * LAYERS)) ** 0.5))  # weight + exp_avg + exp_avg_sq, float32
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(LAYERS)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return TrainState(model, optimizer)


def state_bytes(state) -> int:
    import torch

    total = sum(t.numel() * t.element_size() for t in state.model.state_dict().values())
    for per_param in state.optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in per_param.values() if isinstance(v, torch.Tensor))
    return total


def plain(state) -> dict:
    """What a DCP user saves: the model's and the optimizer's state dicts."""
    return {"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def spec(share: int, shares: int):
    from fthsdp.agent.training.checkpoint.share import ShareSpec

    return ShareSpec(JOB, STEP, STRUCTURE, QUORUM, share, shares, 0, 1)


# ----- 1. save --------------------------------------------------------------------------


def writer(conn, go, mib: float, seed: int) -> None:
    """A replica: holds the state; on each command arms, waits for ``go``, writes."""
    import torch
    import torch.distributed.checkpoint as dcp

    from fthsdp.agent.training.checkpoint import layout
    from fthsdp.agent.training.checkpoint.share import stage, write

    torch.set_num_threads(1)
    _quiet()
    state = make_state(mib, seed)
    conn.send({"bytes": state_bytes(state), "checksums": state.part_checksums()})
    while (command := conn.recv()) is not None:
        kind, step_folder, share, shares = command
        step_folder = Path(step_folder)
        conn.send("armed")
        go.wait()
        began = time.monotonic()
        if kind == "dcp":
            dcp.save(plain(state), checkpoint_id=str(step_folder), no_dist=True)
            staged_at = began
            nbytes = folder_bytes(step_folder)
        else:
            staged = stage(state.capture(), spec(share, shares))
            staged_at = time.monotonic()
            write(staged, step_folder, "")
            nbytes = folder_bytes(step_folder / layout.share_folder_name(share, 0))
        conn.send({"began": began, "staged": staged_at, "ended": time.monotonic(), "bytes": nbytes})


def save_part(args) -> None:
    from fthsdp.agent.training.checkpoint import layout
    from fthsdp.agent.training.checkpoint.seal import read_checkpoint, seal

    ctx = mp.get_context("spawn")
    go = ctx.Event()
    writers = []
    for _ in range(max(args.writers)):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=writer, args=(child, go, args.mib, 0), daemon=True)
        proc.start()
        writers.append((proc, parent))
    hello = [conn.recv() for _, conn in writers]
    if any(h["checksums"] != hello[0]["checksums"] for h in hello):
        raise SystemExit("the writers' states differ: the same seed should make the same state")
    total = hello[0]["bytes"]
    kinds = ["dcp", *args.writers]
    results: dict = {k: [] for k in kinds}
    try:
        for trial in range(args.trials):
            order = kinds[trial % len(kinds):] + kinds[: trial % len(kinds)]
            for kind in order:
                root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-ckpt-", dir=args.dir))
                folder = layout.step_folder(root, JOB, STEP)
                folder.mkdir(parents=True)
                n = 1 if kind == "dcp" else kind
                for share, (_, conn) in enumerate(writers[:n]):
                    conn.send(("dcp" if kind == "dcp" else "share", str(folder), share, n))
                for _, conn in writers[:n]:
                    assert conn.recv() == "armed"
                os.sync()  # not timed: dirty pages of earlier trials (and of other work) are not this trial's to flush
                t_go = time.monotonic()
                go.set()
                done = [conn.recv() for _, conn in writers[:n]]
                go.clear()
                row = {"writers": max(d["ended"] for d in done) - t_go,
                       "stage": max(d["staged"] - d["began"] for d in done),
                       "bytes": max(d["bytes"] for d in done), "seal": 0.0}
                if kind != "dcp":
                    began = time.monotonic()
                    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=n, ranks=1)
                    row["seal"] = time.monotonic() - began
                    read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)  # complete
                row["total"] = row["writers"] + row["seal"]
                results[kind].append(row)
                shutil.rmtree(root)
    finally:
        for proc, conn in writers:
            conn.send(None)
            proc.join(30)

    def med(kind, key: str) -> float:
        return statistics.median(r[key] for r in results[kind])

    base, one = med("dcp", "total"), med(args.writers[0], "total")
    where = args.dir or tempfile.gettempdir()
    print(f"\n### 1. Save time: {total / MIB:.0f} MiB of state (model + AdamW), R writer processes sharing it, "
          f"in {where} ({args.trials} trials, medians)\n")
    print("| writers | MiB written per writer | stage (slowest writer) | writers: start → last share written | "
          "seal | total | total / DCP save | total / (R=1) | target: ≤ 1.2/R | all trials' totals |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    trials = ", ".join(seconds(r["total"]) for r in results["dcp"])
    print(f"| DCP save, 1 process (baseline) | {med('dcp', 'bytes') / MIB:.1f} | – | "
          f"{seconds(med('dcp', 'writers'))} | – | {seconds(base)} | 1.00 | {base / one:.2f} | – | {trials} |")
    verdicts = []
    for r in args.writers:
        t = med(r, "total")
        ratio = t / one
        verdict = "(reference)" if r == args.writers[0] else f"{1.2 / r:.2f}: {'met' if ratio <= 1.2 / r else 'missed'}"
        if r != args.writers[0]:
            verdicts.append(f"R={r}: {ratio:.2f} of R=1 (1/R = {1 / r:.2f}; target ≤ {1.2 / r:.2f}): "
                            f"{'met' if ratio <= 1.2 / r else 'missed'}")
        trials = ", ".join(seconds(x["total"]) for x in results[r])
        print(f"| fthsdp, R={r} | {med(r, 'bytes') / MIB:.1f} | {seconds(med(r, 'stage'))} | "
              f"{seconds(med(r, 'writers'))} | {seconds(med(r, 'seal'))} | {seconds(t)} | {t / base:.2f} | "
              f"{ratio:.2f} | {verdict} | {trials} |")
    print("\n" + "\n".join(verdicts))


def seconds(t: float) -> str:
    return f"{t:.2f} s" if t >= 1 else f"{t * 1e3:.0f} ms"


# ----- 2. step time ---------------------------------------------------------------------

_SEALED = re.compile(r"checkpoint of step (\d+) complete: .*?([\d.]+)s after the step")


def training_run(args, checkpoint: bool, work: Path) -> dict:
    """One run of a coordinator and --replicas workers; the members' mean step over whole intervals."""
    from tests.harness.processes import CoordinatorProcess, WorkerProcess

    k = args.every
    first, last = k, k + args.intervals * k  # one interval of warm-up, then --intervals
    work.mkdir(parents=True)
    env = {"FTHSDP_CHECKSUM_EVERY": "10"}  # the library's default (WorkerProcess's own is 1)
    if checkpoint:
        env.update(FTHSDP_CHECKPOINT_DIR=str(work / "ckpt"), FTHSDP_CHECKPOINT_EVERY=str(k))
    c = CoordinatorProcess(work, "--min-replicas", str(args.replicas)).start()
    workers = []
    try:
        for i in range(args.replicas):
            workers.append(WorkerProcess(work, c.address, f"r{i}", i, "--steps", str(last), "--wait-for",
                                         str(args.replicas), "--hidden", str(args.hidden), env=env).start())
        for w in workers:
            w.finish(timeout=600)
    finally:
        for w in workers:
            w.stop()
        c.stop()
    means = [(w.steps[last]["t"] - w.steps[first]["t"]) / (last - first) for w in workers]
    # Each step's time by its place in the interval: the last one ends with the checkpoint's staging
    # (and a state checksum), the first ones run while its share is written in the background.
    staging, after, rest = [], [], []
    for w in workers:
        for step in range(first + 1, last + 1):
            dt = w.steps[step]["t"] - w.steps[step - 1]["t"]
            (staging if step % k == 0 else after if step % k == 1 else rest).append(dt)
    sealed, skipped = [], 0
    for w in workers:
        text = w.log_path.read_text(errors="replace")
        sealed += [float(m.group(2)) for m in _SEALED.finditer(text) if first <= int(m.group(1)) < last]
        skipped += text.count("skipped: the one before is still being written")
    return {"step": statistics.mean(means), "sealed": sealed, "skipped": skipped,
            "places": [statistics.mean(staging), statistics.mean(after), statistics.mean(rest)]}


def steps_part(args) -> None:
    base = Path(tempfile.mkdtemp(prefix="fthsdp-bench-steps-", dir=args.dir))
    runs: dict[bool, list[dict]] = {False: [], True: []}
    try:
        for pair in range(args.pairs):
            for checkpoint in (False, True):
                runs[checkpoint].append(training_run(args, checkpoint,
                                                     base / f"pair{pair}-{'ckpt' if checkpoint else 'none'}"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    none, ckpt = [r["step"] for r in runs[False]], [r["step"] for r in runs[True]]
    sealed = [x for r in runs[True] for x in r["sealed"]]
    skipped = sum(r["skipped"] for r in runs[True])
    state_mb = 3 * 2 * (args.hidden**2 + args.hidden) * 4 / MIB
    ratios = [c / n for c, n in zip(ckpt, none, strict=True)]
    ratio = statistics.median(ratios)
    k = args.every
    extra = (statistics.median(ckpt) - statistics.median(none)) * k
    print(f"\n### 2. Members' step time, {args.replicas} replicas, ftar_worker --hidden {args.hidden} "
          f"({state_mb:.0f} MiB of state with AdamW), a checkpoint every {k} steps vs none "
          f"({args.pairs} pairs of runs, {args.intervals} intervals of {k} steps each)\n")
    print(f"| run | mean step (median of runs) | all runs (ms) | step {k}n: staging (mean) | step {k}n+1: "
          "the write in the background (mean) | other steps (mean) | checkpoints sealed in the window | skipped | "
          "seal, after its step (median) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for checkpoint, label in ((False, "no checkpoints (baseline)"), (True, f"checkpoint every {k} steps")):
        times = ckpt if checkpoint else none
        places = [statistics.median(r["places"][i] for r in runs[checkpoint]) for i in range(3)]
        tail = (f"{len(sealed)} of {args.pairs * args.intervals} | {skipped} | "
                f"{statistics.median(sealed) if sealed else float('nan'):.2f} s") if checkpoint else "– | – | –"
        print(f"| {label} | {statistics.median(times) * 1e3:.1f} ms | {', '.join(f'{x * 1e3:.1f}' for x in times)} | "
              f"{' | '.join(f'{x * 1e3:.1f} ms' for x in places)} | {tail} |")
    print(f"| ratio (median of pairs) | **{ratio:.3f}** | {', '.join(f'{x:.3f}' for x in ratios)} | | | | | | |")
    verdict = "met" if ratio <= 1.02 else "missed"
    print(f"\nExtra time per checkpoint (difference of the medians × {k}): {extra * 1e3:.0f} ms. "
          f"Target ≤ 1.02: {verdict} ({ratio:.3f}).")
    if extra > 0:
        print(f"At that cost a checkpoint every {math.ceil(extra / (0.02 * statistics.median(none)))} steps or more "
              "would cost ≤ 2% (an extrapolation, not measured).")


# ----- 3. restore -----------------------------------------------------------------------


def restore_part(args) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from fthsdp.agent.training.checkpoint import layout
    from fthsdp.agent.training.checkpoint.restore import load
    from fthsdp.agent.training.checkpoint.seal import read_checkpoint, seal, verify_files
    from fthsdp.agent.training.checkpoint.share import stage, write

    torch.set_num_threads(1)
    _quiet()
    rows = []
    for mib in args.restore_mib:
        source = make_state(mib, 0)
        expected = source.part_checksums()
        nbytes = state_bytes(source)
        root = Path(tempfile.mkdtemp(prefix="fthsdp-bench-restore-", dir=args.dir))
        try:
            folder = layout.step_folder(root, JOB, STEP)
            for share in range(2):
                write(stage(source.capture(), spec(share, 2)), folder)
            digest = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1).digest
            plain_folder = root / "dcp"
            dcp.save(plain(source), checkpoint_id=str(plain_folder), no_dist=True)
            del source
            ours, theirs, checks = [], [], []
            for trial in range(args.trials):
                for kind in (("ours", "dcp") if trial % 2 == 0 else ("dcp", "ours")):
                    target = make_state(mib, 1 + trial)
                    assert target.part_checksums() != expected
                    began = time.monotonic()
                    if kind == "ours":
                        record = read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=digest)
                        target.load(load(folder, record, rank=0, current=target.capture()))
                        ours.append(time.monotonic() - began)
                        began = time.monotonic()
                        verify_files(folder, record)  # what load checks as it reads, as a pass of its own
                        checks.append(time.monotonic() - began)
                    else:
                        dest = plain(target)
                        dcp.load(dest, checkpoint_id=str(plain_folder), no_dist=True)
                        target.model.load_state_dict(dest["model"])
                        target.optimizer.load_state_dict(dest["optimizer"])
                        theirs.append(time.monotonic() - began)
                    if target.part_checksums() != expected:
                        raise SystemExit(f"{kind}: the restored state of {mib} MiB differs from the one saved")
                    del target
        finally:
            shutil.rmtree(root)
        rows.append((nbytes, statistics.median(ours), statistics.median(theirs), statistics.median(checks), ours))
    print(f"\n### 3. Restore time against state size (a checkpoint of 2 shares; {args.trials} trials, medians; "
          "files read from the page cache)\n")
    print("| state | fthsdp: read_checkpoint + load + TrainState.load | GB/s | a separate pass over every file's "
          "digests (timed apart; not part of the restore) | DCP load in place + load_state_dict (baseline) | "
          "fthsdp / DCP | all fthsdp trials |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for nbytes, t, base, check, trials in rows:
        print(f"| {nbytes / MIB:.0f} MiB | {seconds(t)} | {nbytes / t / 1e9:.2f} | {seconds(check)} | "
              f"{seconds(base)} | {t / base:.2f} | {', '.join(seconds(x) for x in trials)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=256, help="state size for the save part")
    p.add_argument("--writers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3],
                   help="the numbers of replicas sharing the write, the first the reference (default 1,2,3)")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary folder)")
    p.add_argument("--hidden", type=int, default=1024, help="tests/ftar_worker.py's model width (step time)")
    p.add_argument("--replicas", type=int, default=3, help="workers in the step-time part")
    p.add_argument("--every", type=int, default=10, help="K: a checkpoint every K steps")
    p.add_argument("--intervals", type=int, default=10, help="checkpoint intervals measured per run")
    p.add_argument("--pairs", type=int, default=5, help="runs with and without checkpoints, alternating")
    p.add_argument("--restore-mib", type=lambda s: [float(x) for x in s.split(",")], default=[8, 64, 256])
    p.add_argument("--skip-save", action="store_true")
    p.add_argument("--skip-steps", action="store_true")
    p.add_argument("--skip-restore", action="store_true")
    args = p.parse_args()
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    _quiet()
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} cores")
    if not args.skip_save:
        save_part(args)
    if not args.skip_steps:
        steps_part(args)
    if not args.skip_restore:
        restore_part(args)
    print(f"\nload average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
