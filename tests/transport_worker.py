"""One member of a cross-replica transport's group, for tests/test_transport.py.

    python -m tests.transport_worker --backend gloo --rank 0 --size 2 --port P --prefix q1 [--start-only]

Builds the group through the transport (fthsdp/agent/training/transport/), runs an
all-reduce, an all-gather and a broadcast, each awaited by polling
``is_completed()`` as FTAR does, and prints one JSON line of what it got.
``--start-only``: start an all-reduce (its peer is gone by then), abort the
group, and print how long the abort took.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport import choose


def await_work(work, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise TimeoutError("a collective did not finish")
        time.sleep(0.001)
    work.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--start-only", action="store_true")
    args = p.parse_args()
    device = torch.device(f"cuda:{args.rank}") if args.backend == "nccl" else torch.device("cpu")
    transport = choose(args.backend, device)
    timeout = datetime.timedelta(seconds=60)
    store = dist.PrefixStore(args.prefix, dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timeout))
    group = transport.build(store, args.rank, args.size, timeout)
    print(json.dumps({"built": True}), flush=True)
    if args.start_only:
        input()  # the test kills the peer, then says go
        t = torch.ones(1 << 16, device=device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        work = group.allreduce([t], opts)
        began = time.monotonic()
        transport.abort(group)
        print(json.dumps({"aborted_in": time.monotonic() - began, "done": work.is_completed()}), flush=True)
        return
    summed = torch.full((1 << 20,), float(args.rank + 1), device=device)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    await_work(group.allreduce([summed], opts))
    row = torch.tensor([args.rank, 7], dtype=torch.int64, device=transport.device)
    rows = [torch.zeros_like(row) for _ in range(args.size)]
    await_work(group.allgather([rows], [row]))
    sent = torch.arange(8, dtype=torch.float32, device=device) * (args.rank + 1)
    bopts = dist.BroadcastOptions()
    bopts.rootRank = 0
    await_work(group.broadcast([sent], bopts))
    print(json.dumps({"sum": sorted({float(x) for x in summed.cpu()}), "rows": [r.tolist() for r in rows],
                      "broadcast": sent.cpu().tolist()}), flush=True)


if __name__ == "__main__":
    main()
