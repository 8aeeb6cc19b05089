"""One rank of a multi-rank replica group for the HSDP tests: FSDP2
(``fully_shard``) inside the replica over the group's own gloo world (RANK,
WORLD_SIZE, MASTER_ADDR/PORT from `fthsdp agent`), FTAR across replicas.

Rank r of replica k trains on batch (step, k * WORLD_SIZE + r), the data a
DDP run with world size replicas * WORLD_SIZE would give global rank
k * WORLD_SIZE + r. Rank 0 prints one JSON line per committed step (with
``time``, the wall clock as it committed: comparable with the agents' and the
coordinator's log timestamps).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fthsdp import Manager
from fthsdp.agent.training.state.train_state import default_update
from tests.ftar_worker import batch, hang, make_model, make_optimizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-for", type=int, default=1)
    p.add_argument("--save", default="")
    p.add_argument("--hang-at", type=int, default=-1,
                   help="at this step, rank --hang-rank blocks forever before its forward pass (first incarnation "
                        "only): the group's other ranks then wait inside FSDP's own collectives")
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--replay-delay", type=float, default=0.0,
                   help="seconds each of the first 10 steps an incarnation replays while catching up takes (a "
                        "catch-up long enough to fail a host during it)")
    p.add_argument("--end-with", type=int, default=0,
                   help="train past --steps until a step commits with this many contributors (a test whose last "
                        "phase needs every replica back, however long that takes)")
    p.add_argument("--every-rank-prints", action="store_true",
                   help="every rank prints its step lines (with its rank), not only rank 0")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds every rank sleeps after each commit (leaves CPU to a test's other processes)")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(args.hidden, args.seed)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = make_optimizer(model)
    update = default_update(optimizer)
    delayed = [10]

    def slow_replay() -> None:
        if ft.replaying and delayed[0] > 0:
            delayed[0] -= 1
            time.sleep(args.replay_delay)
        update()

    ft = Manager.from_env(model, optimizer, update=slow_replay if args.replay_delay else None)
    ft.start(wait_for_replicas=args.wait_for)
    print(json.dumps({"rank": rank, "pid": os.getpid()}), flush=True)
    first_incarnation = os.environ.get("FTHSDP_RESTART_COUNT", "0") == "0"
    contributors = 0
    while (ft.step < args.steps or contributors < args.end_with) and not ft.stopped:
        if first_incarnation and ft.step == args.hang_at and rank == args.hang_rank:
            hang()
        x, y = batch(ft.step, ft.replica_rank * world + rank, args.hidden, args.seed)
        torch.nn.functional.mse_loss(model(x), y).backward()
        result = ft.allreduce_gradients()
        ft.commit()  # the default update: optimizer.step(), zero_grad
        contributors = result.contributors  # the same on every rank of the replica: the quorum's
        if rank == 0 or args.every_rank_prints:
            print(json.dumps({"step": ft.step, "quorum": result.quorum_id, "contributors": result.contributors,
                              "abandoned": result.abandoned, "checksum": ft.checksum,
                              "overlapped": result.overlapped, "time": time.time(),
                              **({"from_rank": rank} if args.every_rank_prints else {})}), flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}  # a collective: every rank
    if args.save and rank == 0:
        torch.save(full, args.save)
    if rank == 0:
        print(json.dumps({"done": ft.step, "stopped": ft.stopped}), flush=True)
    ft.close()  # then the script ends normally


if __name__ == "__main__":
    main()
