"""Puts FTAR in a split that a failure can leave behind and checks the way out.

Two real processes share a fixed quorum (no coordinator). Replica r0 acts as
one that completed step 4's all-reduce before a failure (it holds that sum,
from 3 contributors) and goes on to step 5; r1 acts as one whose step-4
all-reduce was abandoned. r1 must commit r0's step-4 sum, then both step 5.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from fthsdp.agent.training.ftar.allreduce import FTAR, StepResult, StepSum
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.protos.v1 import coordinator_pb2 as pb


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    import datetime

    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, wait_for_workers=False,  # noqa: F841 - hosts the groups
                          timeout=datetime.timedelta(seconds=30))
    tracker = QuorumView(f"r{rank}")
    quorum = pb.Quorum(id=2, member_count=2, first_member_address=f"127.0.0.1:{port}", last_drop_id=2)
    tracker.update(pb.WatchEvent(quorum=quorum, place=pb.QuorumPlace(rank=rank)))
    ftar = FTAR(tracker, "protocol", timeout=30)
    out = {}
    if rank == 0:
        ftar.memory.remember(StepResult(torch.full((4,), 7.0), 3, 1, 0), 4)
        r = ftar.allreduce(StepSum(5, torch.full((4,), 1.0), 1))
        out["step5"] = (r.total.tolist(), r.contributors, r.quorum_id)
    else:
        r = ftar.allreduce(StepSum(4, torch.full((4,), 9.0), 1))
        out["step4"] = (r.total.tolist(), r.contributors, r.quorum_id)
        r = ftar.allreduce(StepSum(5, torch.full((4,), 2.0), 1))
        out["step5"] = (r.total.tolist(), r.contributors, r.quorum_id)
    print(json.dumps(out), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
