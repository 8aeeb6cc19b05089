"""FTAR vs raw torch.distributed all-reduce, same backend, same run.

    python benchmarks/ftar.py [--sizes-mb 1,4,16,64,256] [--replicas 2,3] [--pairs 7]

Each replica is an OS process on loopback (gloo). For every size the two
are measured in alternating pairs of blocks (raw, FTAR, raw, FTAR, ...), each
block a run of back-to-back operations between two barriers, so machine
noise and skew between ranks hit both alike; the table gives per-operation
medians and the median of the per-pair ratios. FTAR here is the full fast path of a step: the in-place
data all-reduce plus the commit agreement (a second, tiny collective); no
coordinator is involved (the quorum is fixed), so this is the data path's cost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(rank: int, n: int, port: int, sizes_mb: list[int], pairs: int) -> None:
    import torch
    import torch.distributed as dist

    from fthsdp.agent.training.ftar.allreduce import CONTROL_SLOTS, FTAR, StepSum
    from fthsdp.agent.training.quorum_view import QuorumView
    from fthsdp.protos.v1 import coordinator_pb2 as pb

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    raw = dist.ProcessGroupGloo(dist.PrefixStore("raw", store), rank, n, timeout)
    tracker = QuorumView(f"r{rank}")
    quorum = pb.Quorum(id=1, member_count=n, first_member_address=f"127.0.0.1:{port}", last_drop_id=1)
    tracker.update(pb.WatchEvent(quorum=quorum, place=pb.QuorumPlace(rank=rank)))
    ftar = FTAR(tracker, "bench", timeout=120)
    step = 0
    results = []
    for mb in sizes_mb:
        # The tail carries FTAR's switch proposals, as in Manager (two float32s).
        t = torch.ones(mb * (1 << 20) // 4 + CONTROL_SLOTS)
        block = max(3, 256 // mb)  # back-to-back ops per timing, so skew between ranks is paid by both
        times = {"raw": [], "ftar": []}
        for i in range(pairs + 1):  # the first pair warms up
            for kind in ("raw", "ftar"):
                raw.barrier().wait()
                start = time.perf_counter()
                for _ in range(block):
                    if kind == "raw":
                        raw.allreduce([t]).wait()
                    else:
                        ftar.allreduce(StepSum(step, t, 1, refill=t.clone, control_slots=True))
                        step += 1
                raw.barrier().wait()
                if i:
                    times[kind].append((time.perf_counter() - start) / block)
        results.append({"mb": mb, "replicas": n, "raw": times["raw"], "ftar": times["ftar"]})
    if rank == 0:
        print(json.dumps(results), flush=True)
    os._exit(0)


def run(n: int, sizes_mb: list[int], pairs: int) -> list[dict]:
    from fthsdp.testing.local_etcd import free_port

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", str(r), "--n", str(n), "--port", str(port),
             "--sizes-mb", ",".join(map(str, sizes_mb)), "--pairs", str(pairs)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for r in range(n)
    ]
    out = procs[0].communicate(timeout=1800)[0]
    for p in procs[1:]:
        p.wait(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = [
        "| size | replicas | raw all-reduce (median) | FTAR (median) | raw algbw | FTAR / raw (median of pairs) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        raw, ftar = statistics.median(r["raw"]), statistics.median(r["ftar"])
        ratio = statistics.median(f / w for f, w in zip(r["ftar"], r["raw"], strict=True))
        gbps = r["mb"] * (1 << 20) / raw / 1e9
        lines.append(
            f"| {r['mb']} MB | {r['replicas']} | {raw * 1e3:.2f} ms | {ftar * 1e3:.2f} ms | {gbps:.2f} GB/s | "
            f"{ratio:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="1,4,16,64,256")
    p.add_argument("--replicas", default="2,3")
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes_mb.split(",")]
    if args.worker >= 0:
        worker(args.worker, args.n, args.port, sizes, args.pairs)
        return
    rows = []
    for n in (int(x) for x in args.replicas.split(",")):
        rows.extend(run(n, sizes, args.pairs))
    print(table(rows))


if __name__ == "__main__":
    main()
