"""A replica whose loop keeps its own step counter, as nanoGPT's train.py does.

``--loop counter``: ``iter_num = ft.step`` once after ``start()``, the learning
rate from ``get_lr(iter_num)`` set into the param groups at the top of each
iteration, an evaluation every ``--eval-interval`` of its own iterations, and
``iter_num += 1`` after ``commit()``. ``--loop range``: ``for step in
range(ft.step, total)``. Neither reads ``ft.step`` inside the loop: they stay
right only if a step is a step (docs/training-api.md).

Prints one JSON line per committed iteration: the loop's own counter
(``step``), ``ft.step``, the learning rate it used and the state checksum.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time

import torch

from fthsdp import Manager
from tests.ftar_worker import batch, make_model


def get_lr(it: int, learning_rate: float = 6e-4, min_lr: float = 6e-5, warmup: int = 20,
           decay_iters: int = 2000) -> float:
    """nanoGPT's schedule: linear warmup, cosine decay to ``min_lr``."""
    if it < warmup:
        return learning_rate * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-for", type=int, default=1)
    p.add_argument("--loop", choices=("counter", "range"), default="counter")
    p.add_argument("--eval-interval", type=int, default=25)
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    model = make_model(args.hidden, args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=get_lr(0), weight_decay=0.1)
    ft = Manager.from_env(model, optimizer)  # the default update: optimizer.step(), zero_grad
    ft.start(wait_for_replicas=args.wait_for)
    print(json.dumps({"admitted": ft.quorum_id, "pid": os.getpid(), "t": time.monotonic(), "at": ft.step,
                      "catch_up": ft.catch_up.as_dict() if ft.catch_up else None}), flush=True)
    eval_x, eval_y = batch(-1, 0, args.hidden, args.seed)

    def train_one(it: int) -> bool:
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if it % args.eval_interval == 0:
            with torch.no_grad():
                model.eval()
                print(json.dumps({"eval": it, "loss": torch.nn.functional.mse_loss(model(eval_x), eval_y).item()}),
                      flush=True)
                model.train()
        x, y = batch(it, ft.replica_rank, args.hidden, args.seed)
        torch.nn.functional.mse_loss(model(x), y).backward()
        ft.allreduce_gradients()
        if not ft.commit():
            return False
        print(json.dumps({"step": it + 1, "ft_step": ft.step, "lr": lr, "checksum": ft.checksum,
                          "t": time.monotonic()}), flush=True)
        return True

    if args.loop == "counter":
        iter_num = ft.step
        while iter_num < args.steps and not ft.stopped:
            if not train_one(iter_num):
                break
            iter_num += 1
    else:
        for step in range(ft.step, args.steps):
            if ft.stopped or not train_one(step):
                break
    print(json.dumps({"done": ft.step, "stopped": ft.stopped}), flush=True)
    ft.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
