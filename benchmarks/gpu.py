"""The GPU data path on one GPU: step time, transports, snapshot copy, catch-up.

The example's step on the GPU, the cross-replica transports on CUDA tensors,
the snapshot's copy of a CUDA state to the host, and a joiner's catch-up of
a CUDA state over HTTP.

    python benchmarks/gpu.py [--quick] [--write-readme]

Needs a visible CUDA GPU (and a torch built with CUDA); elsewhere it exits
at once with status 2 and one line saying so. One short run (under 5 minutes
expected on an H100 or H200; not yet run; --quick: smaller sizes), progress on
stderr, each part's table on stdout as soon as it is measured (a run cut
short keeps what it printed); --write-readme puts the tables into
benchmarks/README.md between the markers ``<!-- gpu.py begin -->`` and
``<!-- gpu.py end -->``. A part that fails prints its error in its table
and the run goes on.

1. Step time (benchmarks/gpu_step.py): a one-replica fthsdp job on NCCL
   (a real coordinator, FTAR, the commit vote, the reports, the checksum
   every 10 steps) against DDP with world size 1 on NCCL, fthsdp.examples.gpt
   in float32 and bfloat16; each run's throughput step over whole checksum
   intervals with no synchronization inside, so fthsdp's host
   synchronizations count. Then, on the training thread, the state checksum
   and a checkpoint share's staging of a 1 GiB CUDA state. The
   cross-replica overlap needs two GPUs: unmeasured until two are lent.
2. Transports. fthsdp's cross-replica transports
   (fthsdp/agent/training/transport/: ``choose("gloo" | "nccl", device)``,
   then ``build(store, 0, 1, timeout)``), each a one-rank group on its own
   prefix of one TCPStore, all-reduce (SUM) in place of CUDA tensors of 1,
   25 and 100 MB, float32 and bfloat16; each call polled with
   ``is_completed()`` (a busy poll: FTAR's growing sleep is not the subject
   here), then ``wait()``, then ``torch.cuda.synchronize()``. Median over
   up to 50 calls or one second, after 3 warm-up calls. A one-rank group
   reduces nothing and sends nothing: see the notes printed with the table.
3-4. The snapshot's copy and catch-up over HTTP: benchmarks/gpu_catchup.py.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- gpu.py begin -->", "<!-- gpu.py end -->"

from benchmarks.gpu_catchup import catchup_http, snapshot_copy  # noqa: E402
from benchmarks.gpu_common import GIB, MB, T0, fmt_time, one_line, progress, sync  # noqa: E402
from benchmarks.gpu_step import tables as step_tables  # noqa: E402


def no_gpu(version: str) -> None:
    print(f"benchmarks/gpu.py needs a CUDA GPU: torch.cuda.is_available() is False (this torch: {version})",
          file=sys.stderr)
    raise SystemExit(2)


def built_without_cuda() -> str | None:
    """torch's version when it is a build without CUDA, read from torch/version.py
    without importing torch (seconds on a busy machine); None otherwise or when unsure."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")  # a top-level package: found, not imported
        if spec is None or not spec.submodule_search_locations:
            return None
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
        values = {}
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
                values[target.id] = node.value.value
        version = values.get("__version__")
        if isinstance(version, str) and "cuda" in values and values["cuda"] is None:
            return version
    except (OSError, SyntaxError, ValueError, IndexError):
        pass
    return None


def need_gpu() -> None:
    """Exit 2 with one line unless torch sees a CUDA GPU (before anything else is imported)."""
    import warnings

    version = built_without_cuda()
    if version is not None:  # a CPU build cannot see a GPU: say so without the import
        no_gpu(version)
    import torch

    with warnings.catch_warnings():  # a CUDA torch without a driver warns here: the line below says it
        warnings.simplefilter("ignore")
        if not torch.cuda.is_available():
            no_gpu(torch.__version__)


# ----- 2. the transports ---------------------------------------------------------------


def time_allreduce(group, t, device, seconds: float = 1.0, most: int = 50) -> tuple[float, int]:
    """(median seconds per in-place SUM all-reduce of ``t``, calls timed)."""
    import torch.distributed as dist

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM

    def once() -> None:
        work = group.allreduce([t], opts)
        deadline = time.monotonic() + 60
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError("an all-reduce did not complete in 60 s")
        work.wait()
        sync(device)  # gloo's copy back, or NCCL's kernel, may still run on a stream after wait()

    for _ in range(3):
        once()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while len(times) < 5 or (len(times) < most and time.perf_counter() < end):
        began = time.perf_counter()
        once()
        times.append(time.perf_counter() - began)
    return statistics.median(times), len(times)


def transports(device, sizes_mb: list[int]) -> list[str]:
    import torch
    import torch.distributed as dist

    from fthsdp.agent.training.transport import choose

    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
    rows = []
    for backend in ("gloo", "nccl"):
        try:
            # host: the data path's address, as ReplicaStep passes FTHSDP_ADVERTISE_HOST (default 127.0.0.1).
            transport = choose(backend, device, host="127.0.0.1")
            began = time.perf_counter()
            group = transport.build(dist.PrefixStore(f"bench-{backend}", store), 0, 1, timeout)
            built = time.perf_counter() - began
        except Exception as e:  # noqa: BLE001 - the table says what failed
            progress(f"transports: {backend}: no group: {one_line(e)}")
            rows.append(f"| {backend} | – | – | group not built: {one_line(e)} | | |")
            continue
        progress(f"transports: {backend} group built in {fmt_time(built)}")
        stuck = False
        for dtype in (torch.float32, torch.bfloat16):
            for mb in sizes_mb:
                name = str(dtype).removeprefix("torch.")
                if stuck:  # a collective that never completed holds the group: the next would wait behind it
                    rows.append(f"| {backend} | {name} | {mb} MB | not run: an earlier call never completed | | |")
                    continue
                try:
                    t = torch.ones(mb * MB // dtype.itemsize, dtype=dtype, device=device)
                    median, calls = time_allreduce(group, t, device)
                    nbytes = t.numel() * t.element_size()
                    rows.append(f"| {backend} | {name} | {mb} MB | {fmt_time(median)} | {nbytes / median / 1e9:.2f} | "
                                f"{calls} |")
                    progress(f"transports: {backend} {name} {mb} MB: {fmt_time(median)}")
                    del t
                except Exception as e:  # noqa: BLE001 - the table says what failed
                    stuck = isinstance(e, TimeoutError)
                    progress(f"transports: {backend} {name} {mb} MB failed: {one_line(e)}")
                    rows.append(f"| {backend} | {name} | {mb} MB | failed: {one_line(e)} | | |")
        try:
            transport.abort(group)  # NCCL: ncclCommAbort, as FTAR lets go of a replaced group; gloo: nothing
        except Exception as e:  # noqa: BLE001
            progress(f"transports: {backend}: abort: {one_line(e)}")
    return [
        "### 2. The cross-replica transports on CUDA tensors: a one-rank group",
        "",
        "| transport | dtype | size | all-reduce (median) | GB/s (size / time) | calls timed |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
        "",
        "What a one-rank group shows, and what it does not: it reduces nothing and sends nothing to another "
        "replica. **gloo**: for CUDA tensors torch's gloo backend copies each tensor to pinned host memory, "
        "reduces there (with one rank, nothing to do) and copies the result back, so its time is the "
        "device-to-host and host-to-device copies plus gloo's hand-off to its thread: the floor of a gloo "
        "all-reduce of CUDA gradients, before any network. **NCCL**: a one-rank communicator uses no link; its "
        "time is the launch and the local work of the call (a kernel, no transfer) plus the polling of its event: "
        "NCCL's per-call overhead. Neither measures cross-GPU or cross-node bandwidth: that needs two GPUs "
        "(tests/test_transport.py runs the contract there) or two hosts.",
        "",
    ]


def gpu_tables(device, pairs: int, steps: int, state_bytes: int) -> list[str]:
    return step_tables(device, pairs, steps, state_bytes, progress=progress)


def environment() -> str:
    import torch

    try:
        nccl = torch.cuda.nccl.version()
        nccl_text = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception as e:  # noqa: BLE001 - a torch without NCCL says so here
        nccl_text = f"unavailable ({one_line(e)})"
    return (f"{datetime.date.today().isoformat()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"NCCL {nccl_text}, {torch.cuda.get_device_name()}")


def write_readme(body: str) -> None:
    text = README.read_text()
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{README}: the markers {BEGIN} and {END} are missing: not written")
    README.write_text(text[: begin + len(BEGIN)] + "\n" + body.strip() + "\n" + text[end:])
    progress(f"wrote the tables into {README.relative_to(ROOT)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer runs (a smoke test)")
    p.add_argument("--write-readme", action="store_true",
                   help=f"replace what lies between {BEGIN} and {END} in benchmarks/README.md with the tables")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="parts not started by then are skipped (the device time of one run is short)")
    p.add_argument("--hard-limit-s", type=float, default=290.0,
                   help="past this the run dumps every thread's stack and exits 1 (a hang)")
    args = p.parse_args()
    need_gpu()
    faulthandler.dump_traceback_later(args.hard_limit_s, exit=True)

    import torch

    device = torch.device("cuda", torch.cuda.current_device())  # an index: NCCL's eager connect keys on it
    env = environment()
    progress(f"{env}{' (--quick)' if args.quick else ''}")
    big = (256 << 20) if args.quick else GIB
    parts = [
        ("1. step time", gpu_tables, (device, 1, 20, 256 << 20) if args.quick else (device, 2, 40, GIB)),
        ("2. transports", transports, (device, [1, 25] if args.quick else [1, 25, 100])),
        ("3. snapshot copy", snapshot_copy, (device, big, 3 if args.quick else 5)),
        ("4. catch-up over HTTP", catchup_http, (device, big, 2 if args.quick else 3)),
    ]
    out: list[str] = []
    for name, fn, fn_args in parts:
        if time.perf_counter() - T0 > args.budget_s:
            lines = [f"### {name}", "", f"skipped: the run's budget of {args.budget_s:.0f} s was spent", ""]
        else:
            progress(f"{name}: start")
            try:
                lines = fn(*fn_args)
            except Exception as e:  # noqa: BLE001 - the next part still runs; the table says what failed
                traceback.print_exc()
                lines = [f"### {name}", "", f"failed: {one_line(e)}", ""]
            torch.cuda.empty_cache()
        print("\n".join(lines), flush=True)
        out += lines
    faulthandler.cancel_dump_traceback_later()
    took = time.perf_counter() - T0
    footer = (f"Run of `python benchmarks/gpu.py{' --quick' if args.quick else ''}`: {env}; "
              f"{took:.0f} s in all.")
    print(footer, flush=True)
    if args.write_readme:
        write_readme("\n".join([*out, footer]))


if __name__ == "__main__":
    main()
