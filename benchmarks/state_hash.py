"""The state checksum's hash: XXH3 (now) against zlib's CRC-32 (before), same run.

    python benchmarks/state_hash.py [--model comm-heavy|gpt] [--trials 7] [--mib 256]

Three rows per kind, each the median of ``--trials`` timings, the kinds
alternating within a trial:

- **raw**: one pass of the hash over ``--mib`` MiB of random bytes in one
  buffer (what a checkpoint block digest or a restore's check costs per byte);
- **state checksum**: ``TrainState.part_checksums(kind)`` of the model of
  ``--model`` with AdamW after one step (parameters and both moments: what a
  replica hashes every ``FTHSDP_CHECKSUM_EVERY`` steps, on a thread of its
  own for one-rank replicas);
- **beside training**: the same checksum on a thread while the training
  thread runs forward/backward/AdamW steps of the same model, and the steps'
  slowdown against steps run alone, the share of its cost a 2-core machine
  pays on the step even when the checksum is off the training thread.

One torch thread. The ratio column is XXH3 / CRC-32 (lower is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("crc32", "xxh3")


def _state(model_name: str):
    import torch

    from benchmarks.step_time import build
    from fthsdp.agent.training.state.train_state import TrainState

    model, data, forward = build(model_name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        x, y = data.batch(i, 0, 8)
        forward(model, x, y).backward()
        optimizer.step()
        optimizer.zero_grad()

    step(0)
    return TrainState(model, optimizer), step


def _timed(fn) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("comm-heavy", "gpt"), default="comm-heavy")
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--mib", type=int, default=256, help="bytes of the raw pass (default 256 MiB)")
    p.add_argument("--steps", type=int, default=3, help="training steps per 'beside training' trial")
    args = p.parse_args()
    if args.trials < 1 or args.mib < 1 or args.steps < 1:
        p.error("--trials, --mib and --steps must be at least 1")

    import torch

    from fthsdp.agent.training.state.checksum import Chain

    torch.set_num_threads(1)
    raw = memoryview(os.urandom(args.mib << 20))
    state, step = _state(args.model)
    nbytes = sum(t.numel() * t.element_size() for t in state.model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in state.optimizer.state.values() for v in s.values()
                  if isinstance(v, torch.Tensor))

    def raw_pass(kind: str) -> None:
        chain = Chain(kind)
        chain.update(raw)
        chain.value()

    rows: dict[str, dict[str, list[float]]] = {k: {"raw": [], "state": [], "beside": [], "alone": []} for k in KINDS}
    counter = 1
    for trial in range(args.trials):
        for kind in KINDS if trial % 2 == 0 else tuple(reversed(KINDS)):
            rows[kind]["raw"].append(_timed(lambda k=kind: raw_pass(k)))
            rows[kind]["state"].append(_timed(lambda k=kind: state.part_checksums(k)))
            alone = []
            for _ in range(args.steps):
                alone.append(_timed(lambda i=counter: step(i)))
                counter += 1
            # The checksum on a thread of its own while the training thread steps: what it costs the step.
            beside = []
            worker = threading.Thread(target=lambda k=kind: state.part_checksums(k))
            worker.start()
            while worker.is_alive() and len(beside) < args.steps:
                beside.append(_timed(lambda i=counter: step(i)))
                counter += 1
            worker.join()
            rows[kind]["alone"].append(statistics.mean(alone))
            rows[kind]["beside"].append(statistics.mean(beside) if beside else float("nan"))

    med = {k: {name: statistics.median(v) for name, v in r.items()} for k, r in rows.items()}
    print(f"model {args.model}: state of {nbytes / 2**20:.0f} MiB (parameters and AdamW moments); raw pass of "
          f"{args.mib} MiB; {args.trials} trials, medians; torch {torch.__version__}")
    print()
    print("| | CRC-32 (before) | XXH3 (now) | XXH3 / CRC-32 |")
    print("|---|---:|---:|---:|")
    c, x = med["crc32"], med["xxh3"]
    print(f"| raw pass, GB/s | {args.mib * 2**20 / c['raw'] / 1e9:.1f} | {args.mib * 2**20 / x['raw'] / 1e9:.1f} | "
          f"{x['raw'] / c['raw']:.2f} (time) |")
    print(f"| state checksum, ms | {c['state'] * 1e3:.1f} | {x['state'] * 1e3:.1f} | {x['state'] / c['state']:.2f} |")
    print(f"| training step alone, ms | {c['alone'] * 1e3:.1f} | {x['alone'] * 1e3:.1f} | - |")
    print(f"| training step with the checksum on another thread, ms | {c['beside'] * 1e3:.1f} | "
          f"{x['beside'] * 1e3:.1f} | - |")
    print(f"| that step / the step alone | {c['beside'] / c['alone']:.3f} | {x['beside'] / x['alone']:.3f} | - |")


if __name__ == "__main__":
    main()
