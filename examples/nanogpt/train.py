"""Train a small GPT the way nanoGPT's train.py does, as one replica of an fthsdp job.

    fthsdp agent --replica-id r0 --num-replicas 3 -- python examples/nanogpt/train.py

Reads top to bottom like nanoGPT's train.py: config, model and optimizer,
data, evaluation, learning-rate schedule, then the loop with gradient
accumulation, mixed precision (``--dtype``) and clipping. fthsdp adds a
handful of lines (examples/nanogpt/README.md shows them as a diff): the
update after the gradient all-reduce becomes a function fthsdp runs at the
step boundary (and replays on a replica that catches up), the GradScaler and
the batch source are registered as state, and the loop all-reduces and
commits instead of calling the optimizer. ``--fail-at-step N`` makes this
replica die at step N (SIGKILL, or exit 3 with ``--fail-how exit``), once:
not after its agent restarted it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from data import BatchSource, CharData, corpus  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

from fthsdp import Manager  # noqa: E402

# ----- config -----------------------------------------------------------------------------
p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
# I/O
p.add_argument("--out-dir", default="", help="save the final state to OUT_DIR/ckpt.pt (empty: no checkpoint)")
p.add_argument("--eval-interval", type=int, default=100, help="estimate the train and val loss every this many steps")
p.add_argument("--eval-iters", type=int, default=10, help="batches per loss estimate")
p.add_argument("--log-every", type=int, default=10)
# data
p.add_argument("--gradient-accumulation-steps", type=int, default=2)
p.add_argument("--batch-size", type=int, default=8, help="sequences per micro-step")
p.add_argument("--block-size", type=int, default=64)
# model
p.add_argument("--n-layer", type=int, default=2)
p.add_argument("--n-head", type=int, default=4)
p.add_argument("--n-embd", type=int, default=64)
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True)
# AdamW
p.add_argument("--learning-rate", type=float, default=1e-3)
p.add_argument("--max-iters", type=int, default=300)
p.add_argument("--weight-decay", type=float, default=0.1)
p.add_argument("--beta1", type=float, default=0.9)
p.add_argument("--beta2", type=float, default=0.99)
p.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm at this value (0: no clipping)")
# learning-rate schedule
p.add_argument("--decay-lr", action=argparse.BooleanOptionalAction, default=True)
p.add_argument("--warmup-iters", type=int, default=20)
p.add_argument("--lr-decay-iters", type=int, default=0, help="steps of the cosine decay (0: --max-iters)")
p.add_argument("--min-lr", type=float, default=1e-4)
# system
p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
p.add_argument("--seed", type=int, default=1337)
# failure injection
p.add_argument("--fail-at-step", type=int, default=-1, help="die at this step, once (not after a restart)")
p.add_argument("--fail-how", choices=("kill", "exit"), default="kill", help="SIGKILL, or sys.exit(3)")
args = p.parse_args()
lr_decay_iters = args.lr_decay_iters or args.max_iters
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
first_start = os.environ.get("FTHSDP_RESTART_COUNT", "0") == "0"  # for --fail-at-step

torch.manual_seed(args.seed)  # the same initial weights on every replica
device_type = "cuda" if "cuda" in args.device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
ctx = torch.autocast(device_type, dtype=ptdtype, enabled=(args.dtype != "float32"))

# ----- model, optimizer, data -------------------------------------------------------------
data = CharData(corpus())
model_args = dict(vocab_size=data.vocab_size, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                  n_embd=args.n_embd, dropout=args.dropout, bias=args.bias)
model = GPT(GPTConfig(**model_args)).to(args.device)
scaler = torch.amp.GradScaler(device_type, enabled=(args.dtype == "float16"))  # a no-op unless float16
optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (args.beta1, args.beta2))
train_batches = BatchSource(data.train, args.batch_size, args.block_size, seed=args.seed)


@torch.no_grad()
def estimate_loss() -> dict[str, float]:
    """The mean loss over the same --eval-iters batches of each split every time."""
    out = {}
    model.eval()
    for split, tokens in (("train", data.train), ("val", data.val)):
        batches = BatchSource(tokens, args.batch_size, args.block_size, seed=0)  # not the training source
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = batches.next()
            with ctx:
                _, loss = model(X.to(args.device), Y.to(args.device))
            losses[k] = loss.item()
        out[split] = round(losses.mean().item(), 4)
    model.train()
    return out


def get_lr(it: int) -> float:
    """Linear warmup over --warmup-iters, then a cosine from --learning-rate down to --min-lr."""
    if not args.decay_lr:
        return args.learning_rate
    if it < args.warmup_iters:
        return args.learning_rate * (it + 1) / (args.warmup_iters + 1)
    if it > lr_decay_iters:
        return args.min_lr
    decay_ratio = (it - args.warmup_iters) / max(1, lr_decay_iters - args.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return args.min_lr + coeff * (args.learning_rate - args.min_lr)


def update() -> None:
    """From the averaged gradients to the next state: unscale, clip, step, zero."""
    if args.grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


# ----- the loop ---------------------------------------------------------------------------
ft = Manager.from_env(model, optimizer, update=update, state={"scaler": scaler, "data": train_batches})
train_batches.shard(ft.replica_rank, ft.num_replicas)  # this replica's part of every epoch
ft.start(wait_for_replicas=ft.num_replicas)
print(json.dumps({"replica": ft.replica_id, "params": model.get_num_params(), "start_step": ft.step,
                  "tokens_per_iter": args.gradient_accumulation_steps * args.batch_size * args.block_size,
                  "pid": os.getpid(), "t": time.monotonic()}), flush=True)
t0 = time.monotonic()
while ft.step < args.max_iters and not ft.stopped:
    if ft.step == args.fail_at_step and first_start:
        print(json.dumps({"failing": args.fail_how, "step": ft.step}), flush=True)
        if args.fail_how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)

    # the learning rate of this step
    lr = get_lr(ft.step)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    if ft.step % args.eval_interval == 0:
        print(json.dumps({"step": ft.step, "eval": estimate_loss()}), flush=True)

    # forward and backward, with gradient accumulation over micro-steps
    for micro_step in range(args.gradient_accumulation_steps):
        X, Y = train_batches.next()  # not prefetched: a step's batches follow from the state at its start
        with ctx:
            logits, loss = model(X.to(args.device), Y.to(args.device))
            loss = loss / args.gradient_accumulation_steps  # the mean over the micro-steps
        scaler.scale(loss).backward()
    ft.allreduce_gradients()  # the average over the quorum's replicas
    if not ft.commit():  # update(), then the step boundary
        break  # this replica has left the job (ft.stopped): drained, or the job finished

    t1 = time.monotonic()
    dt, t0 = t1 - t0, t1
    if ft.step % args.log_every == 0:
        print(json.dumps({
            "step": ft.step, "loss": round(loss.item() * args.gradient_accumulation_steps, 4),
            "lr": optimizer.param_groups[0]["lr"],
            "quorum": ft.quorum_id, "checksum": ft.checksum, "dt_ms": round(dt * 1000, 1), "t": t1,
        }), flush=True)

final = estimate_loss()
if args.out_dir:
    os.makedirs(args.out_dir, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_args": model_args,
                "iter_num": ft.step, "config": vars(args)}, os.path.join(args.out_dir, "ckpt.pt"))
print(json.dumps({"done": ft.step, "drained": ft.stopped, "eval": final, "checksum": ft.checksum}), flush=True)
ft.close()  # leave the job: the other replicas go on without this one
