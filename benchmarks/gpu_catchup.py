"""The GPU data path, parts 3 and 4 of benchmarks/gpu.py (run that script).

3. Snapshot copy. A state of 8 float32 CUDA tensors, 1 GiB in all, as a
   joiner's snapshot takes it (fthsdp/agent/training/state/snapshot.py:
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
4. Catch-up over HTTP. One process: a source (``ServedState`` behind
   fthsdp's ``CatchUpServer`` on loopback, its "training thread" taking the
   snapshot asked for at its next step boundary, every millisecond, of a
   1 GiB CUDA state) and a joiner in the main thread doing what
   fthsdp/agent/training/catchup/joiner.py does with the bytes: ``SourceClient``
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

import statistics
import threading
import time
import zlib

from benchmarks.gpu_common import GIB, TOKEN, fmt_time, progress, state_of, sync

# ----- 3. the snapshot's copy ----------------------------------------------------------


def snapshot_copy(device, nbytes: int, trials: int) -> list[str]:
    import torch

    from fthsdp.agent.training.state.checksum import tensor_bytes
    from fthsdp.agent.training.state.snapshot import Snapshot

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

    from fthsdp.agent.training.catchup.client import SourceClient
    from fthsdp.agent.training.catchup.grad_log import GradientLog
    from fthsdp.agent.training.catchup.server import CatchUpServer
    from fthsdp.agent.training.catchup.source import ServedState
    from fthsdp.agent.training.state.snapshot import state_from_bytes

    state = state_of(device, nbytes)
    dest = {name: torch.empty_like(t) for name, t in state["model"].items()}  # the joiner's model
    total = sum(t.numel() * t.element_size() for t in dest.values())
    sync(device)
    source = ServedState("bench", 0, 0, GradientLog())
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
