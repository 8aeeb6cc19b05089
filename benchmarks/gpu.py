"""The GPU data path on one GPU: step time, transports, snapshot copy, catch-up.

The example's step on the GPU, the cross-replica transports on CUDA tensors,
the snapshot's copy of a CUDA state to the host, and a joiner's catch-up of
a CUDA state over HTTP.

    python benchmarks/gpu.py [--quick] [--write-readme]

Needs a visible CUDA GPU (and a torch built with CUDA); elsewhere it exits
at once with status 2 and one line saying so. One short run (about a minute
expected on an H200; not yet run; --quick: smaller sizes), progress on
stderr, each part's table on stdout as soon as it is measured (a run cut
short keeps what it printed); --write-readme puts the tables into
benchmarks/README.md between the markers ``<!-- gpu.py begin -->`` and
``<!-- gpu.py end -->``. A part that fails prints its error in its table
and the run goes on.

1. Step time. fthsdp.examples.gpt (the GPT of benchmarks/step_time.py, batch
   8 x 128, AdamW) on the GPU: a plain torch loop against the same loop
   through fthsdp's standalone Manager (``Manager.from_env(..., env={})``:
   one replica, no coordinator; ``allreduce_gradients()`` sums nothing, so
   this is the Manager's own per-step cost: the gradient sample, the replay
   contract's check, the default update). Each run's figure is its median
   step time after the warm-up steps, a ``torch.cuda.synchronize()`` ending
   every step; runs alternate in pairs (the order flips each pair); reported:
   each side's median and the median of the pair ratios. Also timed: the
   state checksum a job computes every 10 steps by default (``state_checksum``:
   ``.cpu()`` of every tensor, then CRC-32 on the host), which a standalone
   replica does not.
2. Transports. fthsdp's cross-replica transports
   (fthsdp/agent/training/transport/: ``choose("gloo" | "nccl", device)``,
   then ``build(store, 0, 1, timeout)``), each a one-rank group on its own
   prefix of one TCPStore, all-reduce (SUM) in place of CUDA tensors of 1,
   25 and 100 MB, float32 and bfloat16; each call polled with
   ``is_completed()`` (a busy poll: FTAR's growing sleep is not the subject
   here), then ``wait()``, then ``torch.cuda.synchronize()``. Median over
   up to 50 calls or one second, after 3 warm-up calls. A one-rank group
   reduces nothing and sends nothing: see the notes printed with the table.
3. Snapshot copy. A state of 8 float32 CUDA tensors, 1 GiB in all, as a
   joiner's snapshot takes it (fthsdp/agent/training/snapshot.py:
   ``Snapshot(...)`` flattens the state and allocates one flat host buffer,
   pinned since the tensors are on a GPU, or reuses the last one's;
   ``start()`` enqueues the copies on a side stream that waits for the
   current one; a thread waits on the copy's event, sets ``data_copied``,
   then computes the chunks' CRC-32s). Timed: ``start()`` to ``data_copied``,
   the first snapshot (buffer allocated) apart from the next ones (buffer
   reused). Baseline, same tensors: ``t.cpu()`` of each (pageable memory,
   allocated by the copy). Reference: ``copy_(t, non_blocking=True)`` into a
   preallocated pinned buffer on the current stream, and the checksum path of
   part 1 on the same bytes.
4. Catch-up over HTTP. One process: a source (``CatchUpSource`` behind
   fthsdp's ``CatchUpServer`` on loopback, its "training thread" taking the
   snapshot asked for at its next step boundary, every millisecond, of a
   1 GiB CUDA state) and a joiner in the main thread doing what
   fthsdp/agent/training/joiner.py does with the bytes: ``SourceClient``
   ``request_snapshot()`` (the source's copy and CRCs), ``fetch()`` (8 MiB
   chunks, CRC-checked, into a fresh host buffer), then each tensor copied
   into a CUDA tensor of the same shape (``load_state`` copies the same way).
   Server and client share this process's GIL (benchmarks/catchup_server.py
   measures the HTTP path between two processes, on CPU). Catch-up over
   an NCCL group (``--catch-up-transport distributed``) needs two GPUs, one
   per side (NCCL refuses two ranks on one): its row says so, with no
   figure; benchmarks/catchup.py measures its gloo twin on CPU.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import logging
import statistics
import sys
import threading
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

README = ROOT / "benchmarks" / "README.md"
BEGIN, END = "<!-- gpu.py begin -->", "<!-- gpu.py end -->"
MB, GIB = 10**6, 2**30
TOKEN = "bench-token"
T0 = time.perf_counter()


def progress(message: str) -> None:
    """Progress goes to stderr: stdout holds only the tables."""
    print(f"[gpu.py {time.perf_counter() - T0:6.1f}s] {message}", file=sys.stderr, flush=True)


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


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def one_line(e: BaseException) -> str:
    """An error for a table cell: one line, no pipes, not too long."""
    text = " ".join(f"{type(e).__name__}: {e}".split()).replace("|", "/")
    return text if len(text) <= 300 else text[:297] + "..."


def state_of(device, nbytes: int) -> dict:
    """A state of 8 float32 tensors, ``nbytes`` in all, shaped as ``capture_state`` returns one."""
    import torch

    n = nbytes // 8 // 4
    torch.manual_seed(0)
    return {"model": {f"w{i}": torch.rand(n, device=device) for i in range(8)}}


# ----- 1. the example's step -----------------------------------------------------------


def step_time(device, pairs: int, steps: int, warmup: int) -> list[str]:
    import torch

    from fthsdp import Manager
    from fthsdp.agent.training.checksum import state_checksum
    from fthsdp.examples.gpt.data import Dataset, corpus
    from fthsdp.examples.gpt.model import GPT, GPTConfig

    # A standalone Manager warns that it has no coordinator, each time one is made: known here.
    logging.getLogger("fthsdp.agent.manager").setLevel(logging.ERROR)
    data = Dataset(corpus(), 128)
    batch = 8

    def build():
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=data.vocab_size)).to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(model, step: int):
        x, y = data.batch(step, 0, batch)
        return model(x.to(device), y.to(device))[1]

    def plain() -> float:
        model, optimizer = build()
        times = []
        for step in range(steps):
            began = time.perf_counter()
            loss_of(model, step).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)  # what the Manager's default update does
            sync(device)
            times.append(time.perf_counter() - began)
        return statistics.median(times[warmup:])

    def managed() -> float:
        model, optimizer = build()
        ft = Manager.from_env(model, optimizer, env={})  # an empty env: a standalone replica
        ft.start()
        times = []
        try:
            while ft.step < steps:
                began = time.perf_counter()
                loss_of(model, ft.step).backward()
                ft.allreduce_gradients()
                ft.commit()  # the default update: optimizer.step(), zero_grad
                sync(device)
                times.append(time.perf_counter() - began)
        finally:
            ft.close()
        return statistics.median(times[warmup:])

    base, ft = [], []
    for pair in range(pairs):
        # The order flips each pair, so that a drift of the machine (clocks, caches) hits both alike.
        if pair % 2 == 0:
            base.append(plain())
            ft.append(managed())
        else:
            ft.append(managed())
            base.append(plain())
        progress(f"step time: pair {pair + 1}/{pairs}: plain {fmt_time(base[-1])}, fthsdp {fmt_time(ft[-1])}")
    ratios = [f / b for f, b in zip(ft, base, strict=True)]

    model, optimizer = build()
    loss_of(model, 0).backward()
    optimizer.step()  # AdamW's state exists from the first step on
    sync(device)
    checks = []
    for _ in range(3):
        began = time.perf_counter()
        state_checksum(model, optimizer)
        checks.append(time.perf_counter() - began)
    params = sum(p.numel() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) + sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
        if isinstance(v, torch.Tensor))
    return [
        "### 1. The example's step on the GPU: plain torch against fthsdp's standalone Manager",
        "",
        f"fthsdp.examples.gpt ({params / 1e6:.1f}M parameters), batch {batch} x 128, AdamW; {pairs} pairs of runs "
        f"of {steps} steps, each run's median after {warmup} warm-up steps, synchronized every step.",
        "",
        "| loop | step (median of runs) | all runs | fthsdp / plain (median of pairs) | pair ratios |",
        "|---|---:|---|---:|---|",
        f"| plain torch (baseline) | {fmt_time(statistics.median(base))} | "
        f"{', '.join(fmt_time(t) for t in base)} | 1.000 | |",
        f"| fthsdp standalone Manager | {fmt_time(statistics.median(ft))} | {', '.join(fmt_time(t) for t in ft)} | "
        f"{statistics.median(ratios):.3f} | {', '.join(f'{r:.3f}' for r in ratios)} |",
        "",
        f"State checksum of the same model and AdamW state ({state_bytes / MB:.0f} MB; `state_checksum`: `.cpu()` "
        f"of every tensor, CRC-32 on the host; a job computes one every 10 steps by default on the training "
        f"thread, a standalone replica none): {fmt_time(statistics.median(checks))} (median of 3).",
        "",
    ]


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


# ----- 3. the snapshot's copy ----------------------------------------------------------


def snapshot_copy(device, nbytes: int, trials: int) -> list[str]:
    import torch

    from fthsdp.agent.training.checksum import tensor_bytes
    from fthsdp.agent.training.snapshot import Snapshot

    state = state_of(device, nbytes)
    tensors = list(state["model"].values())
    total = sum(t.numel() * t.element_size() for t in tensors)
    sync(device)

    made, started, copied, crcs = [], [], [], []
    reuse = None
    for trial in range(trials + 1):  # trial 0 allocates the pinned buffer; the others reuse it, as a source does
        sync(device)
        t0 = time.perf_counter()
        snap = Snapshot(trial, "bench", 0, 0, state, reuse=reuse)
        t1 = time.perf_counter()
        snap.start()
        t2 = time.perf_counter()
        if not snap.data_copied.wait(120):
            raise TimeoutError("the snapshot's copy did not finish in 120 s")
        t3 = time.perf_counter()
        if not snap.ready.wait(120):
            raise TimeoutError("the snapshot's CRCs did not finish in 120 s")
        t4 = time.perf_counter()
        if snap.error is not None:
            raise snap.error
        made.append(t1 - t0)
        started.append(t2 - t1)
        copied.append(t3 - t1)
        crcs.append(t4 - t3)
        reuse = snap.buffer
        progress(f"snapshot copy: trial {trial}: buffer {fmt_time(t1 - t0)}, copy {fmt_time(t3 - t1)}")
    first = tensors[0]
    head = snap.buffer[: first.numel() * first.element_size()].view(first.dtype)
    if not torch.equal(head, first.cpu()):
        raise RuntimeError("the snapshot's bytes differ from the tensor's")
    del snap, reuse, head

    plain = []
    for _ in range(trials):
        sync(device)
        began = time.perf_counter()
        copies = [t.cpu() for t in tensors]  # a pageable copy is synchronous
        plain.append(time.perf_counter() - began)
        del copies

    pinned_buffer = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    views, offset = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        views.append(pinned_buffer[offset : offset + n].view(t.dtype))
        offset += n
    pinned = []
    for _ in range(trials):
        sync(device)
        began = time.perf_counter()
        for view, t in zip(views, tensors, strict=True):
            view.copy_(t, non_blocking=True)
        sync(device)
        pinned.append(time.perf_counter() - began)
    del views, pinned_buffer

    checks = []
    for _ in range(max(1, trials // 3)):  # about a second per GiB: a couple of runs are enough
        sync(device)
        began = time.perf_counter()
        crc = 0
        for t in tensors:
            crc = zlib.crc32(tensor_bytes(t), crc)
        checks.append(time.perf_counter() - began)
    progress(f"snapshot copy: baselines done (.cpu() {fmt_time(statistics.median(plain))})")

    base = statistics.median(plain)
    steady = copied[1:]

    def row(what: str, times: list[float]) -> str:
        m = statistics.median(times)
        return (f"| {what} | {fmt_time(m)} | {total / m / 1e9:.2f} | {m / base:.2f} | "
                f"{', '.join(fmt_time(t) for t in times)} |")

    return [
        f"### 3. The snapshot's copy of a CUDA state to the host ({total / GIB:.2f} GiB, 8 float32 tensors)",
        "",
        "| path | time (median) | GB/s | time / `tensor.cpu()` | all trials |",
        "|---|---:|---:|---:|---|",
        row("fthsdp `Snapshot`: pinned buffer reused, side stream (`start()` → `data_copied`)", steady),
        row("fthsdp `Snapshot`, first one: pinned buffer allocated (constructor + `start()` → `data_copied`)",
            [made[0] + copied[0]]),
        row("`t.cpu()` of each tensor (baseline: pageable, allocated by the copy)", plain),
        row("`copy_(t, non_blocking=True)` into a preallocated pinned buffer, current stream (reference)", pinned),
        row("the state checksum's path: `tensor_bytes` (`.cpu()`) + CRC-32 of each tensor (reference)", checks),
        "",
        f"`Snapshot(...)` itself (flatten, manifest, buffer): {fmt_time(made[0])} the first time (pinned "
        f"allocation), {fmt_time(statistics.median(made[1:]))} with the buffer reused. `start()` on the calling "
        f"thread (what the step boundary waits for): {fmt_time(statistics.median(started))}. The CRC-32s of the "
        f"chunks, on the snapshot's thread after the copy: {fmt_time(statistics.median(crcs))}.",
        "",
    ]


# ----- 4. catch-up over HTTP -----------------------------------------------------------


def catchup_http(device, nbytes: int, trials: int) -> list[str]:
    import torch

    from fthsdp.agent.training.catchup_client import SourceClient
    from fthsdp.agent.training.catchup_server import CatchUpServer
    from fthsdp.agent.training.catchup_source import CatchUpSource
    from fthsdp.agent.training.grad_log import GradientLog
    from fthsdp.agent.training.snapshot import state_from_bytes

    state = state_of(device, nbytes)
    dest = {name: torch.empty_like(t) for name, t in state["model"].items()}  # the joiner's model
    total = sum(t.numel() * t.element_size() for t in dest.values())
    sync(device)
    source = CatchUpSource("bench", 0, 0, GradientLog())
    server = CatchUpServer(source, token=TOKEN).start()
    stop = threading.Event()
    failures: list[BaseException] = []

    def training() -> None:
        """The source's training thread: a step boundary every millisecond, where it takes a snapshot asked for."""
        try:
            while not stop.is_set():
                if source.wanted:
                    source.take(0, state)
                    source.wait_copied(60)
                time.sleep(0.001)
        except BaseException as e:  # noqa: BLE001 - reported by the joiner
            failures.append(e)

    trainer = threading.Thread(target=training, name="bench-training", daemon=True)
    trainer.start()
    asked, fetched, loaded, totals = [], [], [], []
    try:
        for trial in range(trials):
            client = SourceClient(server.address, token=TOKEN)
            t0 = time.perf_counter()
            manifest = client.request_snapshot(wait=60)
            t1 = time.perf_counter()
            data = client.fetch(manifest)
            t2 = time.perf_counter()
            received = state_from_bytes(manifest, data)["model"]
            with torch.no_grad():
                for name, t in dest.items():
                    t.copy_(received[name])
            sync(device)
            t3 = time.perf_counter()
            client.release(manifest.step)
            client.close()
            del received, data
            if failures:
                raise failures[0]
            asked.append(t1 - t0)
            fetched.append(t2 - t1)
            loaded.append(t3 - t2)
            totals.append(t3 - t0)
            progress(f"catch-up: trial {trial + 1}/{trials}: {fmt_time(t3 - t0)}")
        for name, t in dest.items():
            if not torch.equal(t, state["model"][name]):
                raise RuntimeError(f"the joiner's {name} differs from the source's")
    finally:
        stop.set()
        trainer.join(10)
        server.close()

    m = statistics.median(totals)
    return [
        f"### 4. Catch-up of a CUDA state ({total / GIB:.2f} GiB): HTTP, and over NCCL",
        "",
        "| path | total (median) | GB/s | snapshot asked → manifest (source's copy + CRCs) | HTTP fetch "
        "(CRC-checked) | into the joiner's CUDA tensors | all trials |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| HTTP (`CatchUpServer` → `SourceClient`), loopback, one process | {fmt_time(m)} | {total / m / 1e9:.2f} | "
        f"{fmt_time(statistics.median(asked))} | {fmt_time(statistics.median(fetched))} | "
        f"{fmt_time(statistics.median(loaded))} | {', '.join(fmt_time(t) for t in totals)} |",
        "| over a two-rank NCCL group (`--catch-up-transport distributed`) | not measured: needs two GPUs "
        "(NCCL refuses two ranks on one); its gloo twin is measured by benchmarks/catchup.py on CPU | | | | | |",
        "",
        "The HTTP row runs source and joiner in one process (they share its GIL; benchmarks/catchup_server.py "
        "runs them as two, on CPU), so it is a floor of what that path costs a joiner on one host, not a figure "
        "for two hosts. The first trial allocates the source's pinned buffer; later ones reuse it.",
        "",
    ]


# ----- the run -------------------------------------------------------------------------


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
    p.add_argument("--budget-s", type=float, default=360.0,
                   help="parts not started by then are skipped (the device time of one run is short)")
    p.add_argument("--hard-limit-s", type=float, default=480.0,
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
        ("1. step time", step_time, (device, 2, 40, 10) if args.quick else (device, 3, 100, 20)),
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
