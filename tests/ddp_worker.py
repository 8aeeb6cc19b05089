"""The oracle for the DDP-equivalence test: the same model, data and optimizer
as tests/ftar_worker.py, under torch's own DistributedDataParallel."""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.ftar_worker import batch, make_model, make_optimizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True, help="an init_method: tcp://HOST:PORT or file://PATH")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", required=True)
    p.add_argument("--names", default="plain", help="the model, as tests/ftar_worker.py's --names")
    p.add_argument("--dtype", default="float32", help="the parameters' dtype, as tests/ftar_worker.py's --dtype")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=60))
    model = make_model(args.hidden, args.seed, args.names).to(getattr(torch, args.dtype))
    ddp = DistributedDataParallel(model)  # broadcast_buffers: rank 0's batch-norm statistics before each forward
    optimizer = make_optimizer(model)
    for step in range(args.steps):
        x, y = (t.to(getattr(torch, args.dtype)) for t in batch(step, args.rank, args.hidden, args.seed))
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.save(model.state_dict(), args.save)
    # Every rank has saved once all reach the barrier; then leave without a
    # teardown: with a file:// store, ranks tearing down at once under load
    # sometimes failed it (a non-zero exit after a good run).
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
