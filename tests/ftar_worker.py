"""A replica's training process for the FTAR tests: a small MLP on a
deterministic data stream, under agent.manager, as a real OS process.

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

from agent.manager import Manager


def make_model(hidden: int, seed: int, names: str = "plain") -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(hidden, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden)]
    if names == "renamed":  # the same sizes under other names: a different model
        return torch.nn.Sequential(collections.OrderedDict(zip(("a", "act", "b"), layers)))
    return torch.nn.Sequential(*layers)


def batch(step: int, replica_rank: int, hidden: int, seed: int, size: int = 8):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + replica_rank)
    return torch.randn(size, hidden, generator=g), torch.randn(size, hidden, generator=g)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-for", type=int, default=1)
    p.add_argument("--die-at", type=int, default=-1)
    p.add_argument("--die-in", choices=("forward", "allreduce", "commit"), default="forward")
    p.add_argument("--die-after", type=float, default=0.005, help="seconds into the all-reduce")
    p.add_argument("--save", default="")
    p.add_argument("--names", choices=("plain", "renamed"), default="plain")
    p.add_argument("--corrupt-at", type=int, default=-1, help="silently perturb a weight after this step")
    p.add_argument("--corrupt-first-replay", action="store_true",
                   help="perturb a weight while replaying the first catch-up (a replay that does not reproduce the state)")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    model = make_model(args.hidden, args.seed, args.names)
    optimizer = make_optimizer(model)
    ft = Manager.from_env(model, optimizer)
    if args.corrupt_first_replay:
        replay, corrupted = ft.replay, []

        def corrupting_replay(entry, data):
            replay(entry, data)
            if not corrupted:
                corrupted.append(entry.step)
                with torch.no_grad():
                    next(model.parameters()).view(-1)[0] += 1e-3

        ft.replay = corrupting_replay
    ft.start(wait_for_replicas=args.wait_for)
    print(json.dumps({"admitted": ft.quorum_id, "pid": os.getpid(), "t": time.monotonic(),
                      "catch_up": ft.catch_up.as_dict() if ft.catch_up else None}), flush=True)
    while ft.step < args.steps and not ft.stopped:
        dying = ft.step == args.die_at
        x, y = batch(ft.step, ft.replica_rank, args.hidden, args.seed)
        if dying and args.die_in == "forward":
            die()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if dying and args.die_in == "allreduce":
            threading.Timer(args.die_after, die).start()
        result = ft.allreduce_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dying and args.die_in == "commit":
            die()
        ft.commit()
        if ft.step == args.corrupt_at:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3
        print(json.dumps({
            "step": ft.step, "quorum": result.quorum_id, "contributors": result.contributors,
            "abandoned": result.abandoned, "checksum": ft.checksum, "loss": loss.item(), "t": time.monotonic(),
        }), flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)
    print(json.dumps({"done": ft.step, "stopped": ft.stopped}), flush=True)
    ft.close()
    # Abandoned gloo collectives may linger until their timeout; do not wait for them.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
