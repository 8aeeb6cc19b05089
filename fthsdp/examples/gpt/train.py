"""Train the example GPT as one replica of an fthsdp job.

    fthsdp agent --coordinator 127.0.0.1:29510 --replica-id r0 --num-replicas 3 \\
        -- python -m fthsdp.examples.gpt.train --steps 300

Reads top to bottom like nanoGPT's train.py: config, data, model, optimizer,
then the loop, where fthsdp adds three calls. Each replica trains on
``--batch-size`` samples per step (the step's batch shrinks while a replica
is out), or, with ``--global-batch G``, every step trains on the same G
samples whatever the quorum: the replicas training the step split them
(``ft.participation()``), so the survivors take a missing replica's share.
``--fail-at-step`` makes this replica die (SIGKILL), hang (SIGSTOP), exit
with an error, or deadlock (its loop blocks after the backward pass, the
process and its heartbeat threads alive) at that step, once (not after its
agent restarted it).
``--samples N`` trains until the job as a whole has trained on N samples
rather than for ``--steps``; ``--decay-lr`` decays the learning rate over the
run (by samples with ``--samples``); ``--eval-every K`` prints the loss on
held-out data every K steps and at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time

import torch

from fthsdp import Manager
from fthsdp.examples.gpt.data import Dataset, corpus
from fthsdp.examples.gpt.model import GPT, GPTConfig

# ----- config -----------------------------------------------------------------------------
p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch-size", type=int, default=8, help="samples per replica per step (and per validation batch)")
p.add_argument("--global-batch", type=int, default=0,
               help="samples per step, split equally among the replicas training it (0: --batch-size per replica)")
p.add_argument("--block-size", type=int, default=128)
p.add_argument("--n-layer", type=int, default=4)
p.add_argument("--n-embd", type=int, default=256)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--decay-lr", action="store_true", help="cosine decay of --lr to a tenth over --samples (or --steps)")
p.add_argument("--seed", type=int, default=0)
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--log-every", type=int, default=10)
p.add_argument("--fail-at-step", type=int, default=-1)
p.add_argument("--fail-how", choices=("kill", "hang", "exit", "deadlock"), default="kill")
p.add_argument("--samples", type=int, default=0,
               help="also stop once the job trained on this many samples (0: no limit)")
p.add_argument("--eval-every", type=int, default=0,
               help="validation loss every this many steps and at the end (0: never)")
p.add_argument("--eval-batches", type=int, default=20, help="held-out batches of --batch-size per validation loss")
args = p.parse_args()
if args.global_batch < 0 or args.batch_size < 1:
    p.error(f"--global-batch must be 0 or more and --batch-size at least 1, "
            f"got {args.global_batch} and {args.batch_size}")
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
first_start = os.environ.get("FTHSDP_RESTART_COUNT", "0") == "0"

# ----- data and model ---------------------------------------------------------------------
data = Dataset(corpus(), args.block_size)
torch.manual_seed(args.seed)  # every replica starts from the same weights
model = GPT(GPTConfig(vocab_size=data.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                      n_embd=args.n_embd)).to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
n_params = sum(p.numel() for p in model.parameters())


class Counters:
    """Samples the whole job trained on, and this step's samples per replica:
    registered with fthsdp (state=...), so a replica that catches up receives
    them with the model, and replays them with every step it missed."""

    def __init__(self) -> None:
        self.samples, self.replica_batch = 0, args.batch_size

    def state_dict(self) -> dict:
        return {"samples": self.samples, "replica_batch": self.replica_batch}

    def load_state_dict(self, state: dict) -> None:
        self.samples, self.replica_batch = state["samples"], state["replica_batch"]


counters = Counters()


def samples_trained() -> int:
    return counters.samples


def update() -> None:
    """The step's update, run by ft.commit() and replayed by a replica that
    catches up: the optimizer step, and the samples the step trained on."""
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    counters.samples += ft.contributors * counters.replica_batch


def get_batch():
    """This replica's batch of the step: batch (step, replica rank) of
    --batch-size, or with --global-batch its share of the step's G samples.
    The shares are equal (the remainder of G over the replicas is left out
    of the step): the all-reduce averages the replicas' mean gradients, which
    is then the mean over the step's samples."""
    if not args.global_batch:
        return (*data.batch(ft.step, ft.replica_rank, args.batch_size, args.seed), args.batch_size)
    place = ft.participation()
    share = args.global_batch // place.count
    if share == 0:
        sys.exit(f"train.py: --global-batch {args.global_batch} leaves no sample for each of {place.count} replicas")
    x, y = data.batch(ft.step, 0, args.global_batch, args.seed)  # the same G samples whoever trains the step
    mine = slice(place.index * share, (place.index + 1) * share)
    return x[mine], y[mine], share


def get_lr() -> float:
    """--lr, or with --decay-lr its cosine decay to a tenth over the run: by
    samples with --samples (a step may train on fewer: see get_batch and update)."""
    if not args.decay_lr:
        return args.lr
    progress = min(1.0, samples_trained() / args.samples if args.samples else ft.step / args.steps)
    return args.lr / 10 + 0.5 * (1.0 + math.cos(math.pi * progress)) * (args.lr - args.lr / 10)


@torch.no_grad()
def val_loss() -> float:
    """The mean loss on fixed held-out batches: the same data in every run, whatever --seed."""
    model.eval()
    losses = []
    for i in range(args.eval_batches):
        x, y = data.batch(i, 0, args.batch_size, seed=0, split="val")
        losses.append(model(x.to(args.device), y.to(args.device))[1].item())
    model.train()
    return sum(losses) / len(losses)


def report_val_loss() -> None:
    print(json.dumps({"step": ft.step, "samples": samples_trained(), "val_loss": round(val_loss(), 5)}), flush=True)


# ----- the loop ---------------------------------------------------------------------------
ft = Manager.from_env(model, optimizer, update=update, state={"counters": counters})
ft.start(wait_for_replicas=ft.num_replicas if first_start else 1)
print(json.dumps({"replica": ft.replica_id, "params": n_params, "quorum": ft.quorum_id, "start_step": ft.step,
                  "pid": os.getpid(), "t": time.monotonic(),
                  "catch_up": ft.catch_up.as_dict() if ft.catch_up else None}), flush=True)
started = time.monotonic()
while ft.step < args.steps and samples_trained() < (args.samples or float("inf")) and not ft.stopped:
    failing = ft.step == args.fail_at_step and first_start
    if failing and args.fail_how != "deadlock":
        print(json.dumps({"failing": args.fail_how, "step": ft.step}), flush=True)
        if args.fail_how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif args.fail_how == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            sys.exit(3)
    for group in optimizer.param_groups:
        group["lr"] = get_lr()  # before allreduce_gradients(): recorded with the step, and replayed
    x, y, counters.replica_batch = get_batch()  # before allreduce_gradients(), as the lr
    _, loss = model(x.to(args.device), y.to(args.device))
    loss.backward()
    if failing and args.fail_how == "deadlock":  # blocks for good; the heartbeat threads go on
        print(json.dumps({"failing": "deadlock", "step": ft.step, "t": time.monotonic()}), flush=True)
        threading.Event().wait()
    result = ft.allreduce_gradients()  # the average over the quorum, redone among survivors on a failure
    if result is None:  # drained: the quorum went on without this replica
        break
    if not ft.commit():  # runs update(), then the step boundary
        break  # this replica has left the job (ft.stopped): drained, or the job finished
    if ft.step % args.log_every == 0:
        print(json.dumps({
            "step": ft.step, "loss": round(loss.item(), 4), "quorum": result.quorum_id,
            "replicas": result.contributors, "batch": counters.replica_batch,
            "samples": samples_trained(), "checksum": ft.checksum,
            "elapsed_s": round(time.monotonic() - started, 2), "t": time.monotonic(),
        }), flush=True)
    if args.eval_every and ft.step % args.eval_every == 0:
        report_val_loss()
if args.eval_every and ft.step % args.eval_every != 0 and not ft.stopped:  # the end, unless just evaluated
    report_val_loss()
print(json.dumps({"done": ft.step, "drained": ft.stopped, "samples": samples_trained()}), flush=True)
ft.close()  # leave the job: the other replicas go on without this one; the script then ends normally
