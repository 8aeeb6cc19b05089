"""The oracle for the nanoGPT example's DDP-equivalence test: the loop of
examples/nanogpt/train.py (gradient accumulation, autocast and GradScaler,
clipping, warmup and cosine learning rate, AdamW with weight decay on the 2-D
parameters) written the plain way, under torch's own DistributedDataParallel
with world size N: gradients averaged on the last micro-step's backward
(``no_sync()`` for the others), ``optimizer.step()`` in the loop. The flags
that shape training have train.py's names; the test passes the same ones to
both. Rank r saves ``{"model": state_dict}`` to --save.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "nanogpt"))

from data import BatchSource, CharData, corpus  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True, help="an init_method: tcp://HOST:PORT or file://PATH")
    p.add_argument("--save", required=True)
    p.add_argument("--max-iters", type=int, required=True)
    p.add_argument("--gradient-accumulation-steps", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--n-layer", type=int, required=True)
    p.add_argument("--n-head", type=int, required=True)
    p.add_argument("--n-embd", type=int, required=True)
    p.add_argument("--learning-rate", type=float, required=True)
    p.add_argument("--weight-decay", type=float, required=True)
    p.add_argument("--beta1", type=float, required=True)
    p.add_argument("--beta2", type=float, required=True)
    p.add_argument("--grad-clip", type=float, required=True)
    p.add_argument("--warmup-iters", type=int, required=True)
    p.add_argument("--lr-decay-iters", type=int, required=True)
    p.add_argument("--min-lr", type=float, required=True)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), required=True)
    p.add_argument("--seed", type=int, required=True)
    args, _ = p.parse_known_args()  # train.py's other flags (eval, logging) do not change the parameters
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=60))

    torch.manual_seed(args.seed)
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    ctx = torch.autocast("cpu", dtype=ptdtype, enabled=(args.dtype != "float32"))
    data = CharData(corpus())
    model = GPT(GPTConfig(vocab_size=data.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                          n_head=args.n_head, n_embd=args.n_embd, dropout=0.0, bias=True))
    scaler = torch.amp.GradScaler("cpu", enabled=(args.dtype == "float16"))
    optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (args.beta1, args.beta2))
    ddp = DistributedDataParallel(model)
    batches = BatchSource(data.train, args.batch_size, args.block_size, seed=args.seed).shard(args.rank, args.world)

    def lr_at(it: int) -> float:  # warmup, then cosine to min_lr (written again: this is the oracle)
        if it < args.warmup_iters:
            return args.learning_rate * (it + 1) / (args.warmup_iters + 1)
        if it > args.lr_decay_iters:
            return args.min_lr
        ratio = (it - args.warmup_iters) / max(1, args.lr_decay_iters - args.warmup_iters)
        return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.learning_rate - args.min_lr)

    accum = args.gradient_accumulation_steps
    for it in range(args.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it)
        for micro_step in range(accum):
            X, Y = batches.next()
            # DDP averages the gradients in the last micro-step's backward only
            with contextlib.nullcontext() if micro_step == accum - 1 else ddp.no_sync():
                with ctx:
                    _, loss = ddp(X, Y)
                    loss = loss / accum
                scaler.scale(loss).backward()
        if args.grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    torch.save({"model": model.state_dict()}, args.save)
    # Every rank has saved once all reach the barrier; then leave without a
    # teardown (as tests/ddp_worker.py: ranks tearing down a file:// store at
    # once under load sometimes failed it).
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
