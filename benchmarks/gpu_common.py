"""What the parts of benchmarks/gpu.py share: progress on stderr, timing and table helpers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB, GIB = 10**6, 2**30
TOKEN = "bench-token"
T0 = time.perf_counter()


def progress(message: str) -> None:
    """Progress goes to stderr: stdout holds only the tables."""
    print(f"[gpu.py {time.perf_counter() - T0:6.1f}s] {message}", file=sys.stderr, flush=True)


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
