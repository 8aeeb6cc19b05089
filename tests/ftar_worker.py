"""A replica's training process for the FTAR tests: a small MLP on a
deterministic data stream, under fthsdp.agent.training.manager, as a real OS process.

Prints one JSON line per committed step (step, quorum, contributors,
abandoned collectives, state checksum, monotonic time) and, with --save, the
final parameters. Failure injection: --die-at STEP --die-in forward|allreduce|commit
SIGKILLs this process at that point of that step.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import signal
import sys
import threading
import time

import torch

from fthsdp import Manager


def make_model(hidden: int, seed: int, names: str = "plain") -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(hidden, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden)]
    if names == "renamed":  # the same sizes under other names: a different model
        return torch.nn.Sequential(collections.OrderedDict(zip(("a", "act", "b"), layers, strict=True)))
    if names == "batchnorm":  # running statistics that every forward pass changes
        return torch.nn.Sequential(*layers[:2], torch.nn.BatchNorm1d(hidden), layers[2])
    return torch.nn.Sequential(*layers)


def batch(step: int, replica_rank: int, hidden: int, seed: int, size: int = 8):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + replica_rank)
    return torch.randn(size, hidden, generator=g), torch.randn(size, hidden, generator=g)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


class DataPosition:
    """A registered stateful data source: the batches it has handed out."""

    def __init__(self) -> None:
        self.served = 0

    def state_dict(self) -> dict:
        return {"served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.served = state["served"]


class Ema:
    """An exponential moving average of the weights (registered; over 256 KiB
    at --hidden 512, so it must change only inside the update)."""

    def __init__(self, model: torch.nn.Module, decay: float = 0.99) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                self.shadow[k].lerp_(v, 1 - self.decay)
            else:  # a batch count: the latest, as torch.optim.swa_utils does for buffers
                self.shadow[k].copy_(v)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.decay = state["decay"]
        for k, v in state["shadow"].items():
            self.shadow[k].copy_(v)


def full_loop(model: torch.nn.Module, amp: str, replay_delay: float = 0.0, replaying=lambda: False, delayed: int = 10,
              variant: str = "adamw"):
    """The loop PyTorch's docs describe: AdamW with weight decay on 2-D
    parameters only, accumulation over micro-batches, autocast + GradScaler,
    clip_grad_norm_, a warmup + cosine LambdaLR stepped after optimizer.step(),
    an EMA of the weights, a registered data position. ``variant="sgd"``:
    the same shape from torch's other building blocks: SGD with Nesterov
    momentum, SequentialLR (LinearLR warmup, then CosineAnnealingLR),
    clip_grad_value_, and torch.optim.swa_utils.AveragedModel as the EMA."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if variant == "sgd":
        return _sgd_loop(model, amp, groups, replay_delay, replaying, delayed)
    optimizer = torch.optim.AdamW(groups, lr=1e-3)

    def lr_lambda(step: int) -> float:
        import math

        warmup, total = 5, 200
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3, enabled=dtype is torch.float16)
    ema = Ema(model)
    data = DataPosition()
    update = make_update(optimizer, scaler, scheduler, lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0),
                         lambda: ema.update(model), replay_delay, replaying, delayed)
    state = {"scheduler": scheduler, "scaler": scaler, "ema": ema, "data": data}
    return optimizer, update, state, micro_batches(model, scaler, dtype, data)


def make_update(optimizer, scaler, scheduler, clip, average, replay_delay, replaying, delayed):
    """The update fthsdp runs at commit and a joiner replays: unscale, clip, step, schedule, average."""
    slowed = [delayed]

    def update() -> None:
        if replay_delay and replaying() and slowed[0] > 0:
            slowed[0] -= 1
            time.sleep(replay_delay)  # --replay-delay: a replay slow enough to fail a source during it
        scaler.unscale_(optimizer)
        clip()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        average()
        optimizer.zero_grad(set_to_none=True)

    return update


def micro_batches(model, scaler, dtype, data):
    """The forward and backward passes of a step: two micro-batches, autocast, the scaler."""

    def forward_backward(step: int, replica_rank: int, hidden: int, seed: int, die_forward) -> torch.Tensor:
        losses = []
        for micro in range(2):
            x, y = batch(data.served, replica_rank, hidden, seed)
            data.served += 1
            if micro == 1 and die_forward:
                die_forward()
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = torch.nn.functional.mse_loss(model(x), y) / 2
            scaler.scale(loss).backward()
            losses.append(loss.detach())
        return sum(losses)

    return forward_backward


def _sgd_loop(model, amp, groups, replay_delay, replaying, delayed):
    from torch.optim import lr_scheduler, swa_utils

    optimizer = torch.optim.SGD(groups, lr=0.05, momentum=0.9, nesterov=True)
    scheduler = lr_scheduler.SequentialLR(optimizer, [
        lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=5),
        lr_scheduler.CosineAnnealingLR(optimizer, T_max=200, eta_min=1e-3),
    ], milestones=[5])
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3, enabled=dtype is torch.float16)
    ema = swa_utils.AveragedModel(model, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.99), use_buffers=True)
    data = DataPosition()
    forward_backward = micro_batches(model, scaler, dtype, data)
    update = make_update(optimizer, scaler, scheduler,
                         lambda: torch.nn.utils.clip_grad_value_(model.parameters(), 0.05),
                         lambda: ema.update_parameters(model), replay_delay, replaying, delayed)
    return optimizer, update, {"scheduler": scheduler, "scaler": scaler, "ema": ema, "data": data}, forward_backward


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def hang() -> None:
    """Block this (the training) thread forever; the heartbeat threads live on."""
    print(json.dumps({"hanging": os.getpid(), "t": time.monotonic()}), flush=True)
    threading.Event().wait()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-for", type=int, default=1)
    p.add_argument("--die-at", type=int, default=-1)
    p.add_argument("--die-in", choices=("forward", "backward", "allreduce", "commit"), default="forward",
                   help="backward: as the first parameter's gradient is ready, the buckets of the later ones on "
                        "their way (fthsdp/agent/training/ftar/overlap.py)")
    p.add_argument("--die-after", type=float, default=0.005, help="seconds into the all-reduce")
    p.add_argument("--hang-at", type=int, default=-1, help="block forever during this step (first incarnation only)")
    p.add_argument("--hang-in", choices=("data", "backward", "update", "section"), default="backward",
                   help="where: fetching the batch, after backward (before the all-reduce), inside the update, "
                        "or in a marked section before the all-reduce")
    p.add_argument("--hang-on-signal", action="store_true",
                   help="SIGUSR1 makes the next step block after backward (first incarnation only)")
    p.add_argument("--section-at", type=int, default=-1, help="run a marked 'eval' section of --section-s at this step")
    p.add_argument("--section-s", type=float, default=3.0)
    p.add_argument("--slow", type=float, default=0.0, help="seconds of extra compute per step (a straggler)")
    p.add_argument("--save", default="")
    p.add_argument("--names", choices=("plain", "renamed", "batchnorm"), default="plain")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the parameters' (and so the gradients') dtype, with --loop plain")
    p.add_argument("--corrupt-at", type=int, default=-1, help="silently perturb a weight after this step")
    p.add_argument("--loop", choices=("plain", "full"), default="plain",
                   help="full: accumulation, autocast + GradScaler, clipping, a scheduler, an EMA (see full_loop)")
    p.add_argument("--amp", choices=("none", "bf16", "fp16"), default="fp16", help="autocast dtype of --loop full")
    p.add_argument("--variant", choices=("adamw", "sgd"), default="adamw", help="--loop full's building blocks")
    p.add_argument("--replay-delay", type=float, default=0.0,
                   help="seconds each of the first 10 replayed steps of --loop full takes")
    p.add_argument("--misuse", choices=("none", "step-outside", "clip-outside", "ema-outside"), default="none",
                   help="break the replay contract (docs/training-api.md, the replay contract) in the way named")
    p.add_argument("--lr-from-counter", action="store_true",
                   help="set the learning rate before each step from a counter of the loop's own, 0 at every "
                        "process start, instead of from ft.step: a replica that rejoins diverges after its catch-up")
    p.add_argument("--corrupt-first-replay", action="store_true",
                   help="perturb a weight while replaying the first catch-up (a replay that does not reproduce "
                        "the state)")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    model = make_model(args.hidden, args.seed, args.names).to(getattr(torch, args.dtype))
    if args.loop == "full":
        optimizer, update, state, forward_backward = full_loop(model, args.amp, args.replay_delay, lambda: ft.replaying,
                                                               variant=args.variant)
    else:
        optimizer, update, state, forward_backward = make_optimizer(model), None, None, None
    first_incarnation = os.environ.get("FTHSDP_RESTART_COUNT", "0") == "0"
    hang_asked = threading.Event()
    if args.hang_on_signal:
        signal.signal(signal.SIGUSR1, lambda *_: hang_asked.set())
    if args.hang_in == "update" and args.hang_at >= 0 and update is None:
        def update():  # the default update, with the hang inside
            if first_incarnation and ft.step == args.hang_at and not ft.replaying:
                hang()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if args.corrupt_first_replay:
        inner, corrupted = update, []

        def update():  # the script's update, with the first replayed step made to differ
            if inner is not None:
                inner()
            else:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if ft.replaying and not corrupted:
                corrupted.append(ft.step)
                with torch.no_grad():
                    next(model.parameters()).view(-1)[0] += 1e-3
    ft = Manager.from_env(model, optimizer, update=update, state=state)
    ft.start(wait_for_replicas=args.wait_for)
    print(json.dumps({"admitted": ft.quorum_id, "pid": os.getpid(), "t": time.monotonic(),
                      "catch_up": ft.catch_up.as_dict() if ft.catch_up else None}), flush=True)
    own_steps = 0  # --lr-from-counter: what a loop that keeps its own count has
    while ft.step < args.steps and not ft.stopped:
        if args.lr_from_counter:
            for group in optimizer.param_groups:
                group["lr"] = 1e-3 / (1 + 0.01 * own_steps)  # recorded as the step's input at the all-reduce
        dying = ft.step == args.die_at
        hanging = first_incarnation and (ft.step == args.hang_at or hang_asked.is_set())
        if hanging and args.hang_in == "data":
            hang()
        if ft.step == args.section_at:
            with ft.section("eval"):
                time.sleep(args.section_s)  # the work of the section (an evaluation), not a synchronisation
        if args.slow:
            time.sleep(args.slow)  # a straggler's slower compute
        x, y = (t.to(getattr(torch, args.dtype)) for t in batch(ft.step, ft.replica_rank, args.hidden, args.seed))
        if dying and args.die_in == "forward" and forward_backward is None:
            die()
        if forward_backward is not None:
            loss = forward_backward(ft.step, ft.replica_rank, args.hidden, args.seed,
                                    die if dying and args.die_in == "forward" else None)
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
            if dying and args.die_in == "backward":
                next(model.parameters()).register_post_accumulate_grad_hook(lambda _p: die())
            loss.backward()
        if hanging and args.hang_in == "backward":
            hang()
        if hanging and args.hang_in == "section":
            with ft.section("stuck", timeout=2.0):
                hang()
        if dying and args.die_in == "allreduce":
            threading.Timer(args.die_after, die).start()
        result = ft.allreduce_gradients()
        if args.misuse == "step-outside":
            optimizer.step()
        elif args.misuse == "clip-outside":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        elif args.misuse == "ema-outside":
            state["ema"].update(model)
        if dying and args.die_in == "commit":
            die()
        if not ft.commit():  # the update (by default optimizer.step(), zero_grad), then the boundary
            continue  # no member contributed: the step is run again
        own_steps += 1
        if ft.step == args.corrupt_at:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3
        print(json.dumps({
            "step": ft.step, "quorum": result.quorum_id, "contributors": result.contributors,
            "abandoned": result.abandoned, "checksum": ft.checksum, "loss": loss.item(), "t": time.monotonic(),
            "overlapped": result.overlapped,
        }), flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)
    print(json.dumps({"done": ft.step, "stopped": ft.stopped}), flush=True)
    ft.close()  # the script then ends normally: no abandoned collective holds its exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
